"""Beats are group-committed: many beats share one transaction, yet none is
answered before the transaction holding its nonce has committed, a nonce
replayed inside a batch counts once, and a failed commit answers no one."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from eth_account import Account
from sqlalchemy import event, select

from shoal.client.identity import sign_request
from shoal.coordinator.db import beats
from shoal.coordinator.db.database import GroupCommit, open_engine
from shoal.coordinator.db.schema import NonceRow
from tests.coordinator.conftest import Served, provider_with_agent
from tests.coordinator.test_heartbeats import BODY, beat_request, last_seen, send


def nonce_rows(store_url: str, address: str) -> set[str]:
    """The nonces the store holds for `address`, read on a connection of our own."""
    engine = open_engine(store_url)
    try:
        with engine.connect() as connection:
            return set(connection.scalars(select(NonceRow.nonce).where(NonceRow.address == address)))
    finally:
        engine.dispose()


def test_a_beat_is_answered_only_once_its_nonce_is_committed(served: Served, store_url):
    provider = Account.create()
    provider_with_agent(served.client(provider))
    engine = served.app.state.coordinator.engine
    pending: list = []  # at each commit: were any beats already answered?
    answered: list[bool] = []

    def at_commit(_connection) -> None:  # noqa: ANN001
        answered.append(any(f.done() for f in pending))

    event.listen(engine, "commit", at_commit)
    committer = beats.beat_committer(engine)
    submit = committer.submit

    def watched(item):  # noqa: ANN001, ANN202
        future = submit(item)
        pending.append(future)
        return future

    committer.submit = watched
    try:
        target, headers = beat_request(provider)
        assert send(served, target, headers).status_code == 200
    finally:
        committer.submit = submit
        event.remove(engine, "commit", at_commit)
    assert pending and answered and not any(answered)
    # Durable, not merely in this process: another connection sees the nonce.
    assert headers["x-shoal-nonce"] in nonce_rows(store_url, provider.address)


def test_a_replay_in_the_same_batch_counts_once(served: Served):
    provider = Account.create()
    provider_with_agent(served.client(provider))
    target, headers = beat_request(provider)

    async def flood() -> list[int]:  # the captured beat, sent 12 times at once
        async with httpx.AsyncClient(base_url=served.url) as client:
            replies = await asyncio.gather(*(client.post(
                target, content=BODY, headers={"content-type": "application/json", **headers})
                for _ in range(12)))
        return [reply.status_code for reply in replies]

    statuses = sorted(asyncio.run(flood()))
    assert statuses == [200] + [401] * 11


def test_take_beats_refuses_a_nonce_twice_in_one_batch(served: Served):
    provider = Account.create()
    provider_with_agent(served.client(provider))
    note = beats.BeatNote(provider.address, "agent-a", [], 1.0e9, nonce="n-0123456789",
                          role_needed="provider")
    engine = served.app.state.coordinator.engine
    with engine.begin() as connection:
        taken = beats.take_beats(connection, [note, note, note])
    assert [t.outcome for t in taken] == [beats.BeatOutcome.noted] + [beats.BeatOutcome.replayed] * 2


def test_a_failed_commit_answers_no_one_and_keeps_nothing(served: Served, store_url):
    provider = Account.create()
    provider_with_agent(served.client(provider))
    engine = served.app.state.coordinator.engine
    release = threading.Event()

    def failing(connection, notes):  # noqa: ANN001, ANN202 - writes, then the commit fails
        beats.take_beats(connection, notes)
        release.wait(5)
        raise RuntimeError("disk full")

    committer = GroupCommit(engine, failing)
    notes = [beats.BeatNote(provider.address, "agent-a", [], 1.0e9 + i, nonce=f"nonce-{i:04d}x",
                            role_needed="provider") for i in range(5)]
    seen = last_seen(served)
    futures = [committer.submit(note) for note in notes]
    assert not any(f.done() for f in futures)
    release.set()
    for future in futures:
        with pytest.raises(RuntimeError):
            future.result(timeout=10)
    assert not {n.nonce for n in notes} & nonce_rows(store_url, provider.address)
    assert last_seen(served) == seen


def test_a_malformed_beat_is_answered_as_the_declared_route_answers(served: Served):
    provider = Account.create()
    provider_with_agent(served.client(provider))
    bad = b'{"running": "all"}'
    target = "/v1/agents/agent-a/heartbeat"
    headers = sign_request(provider, "shoal-test", "POST", target, bad)
    reply = httpx.post(served.url + target, content=bad,
                       headers={"content-type": "application/json", **headers})
    assert reply.status_code == 422 and "running" in reply.text
    unsigned = httpx.post(served.url + target, content=bad,
                          headers={"content-type": "application/json"})
    assert unsigned.status_code == 401  # the signature is checked first, as on every route
    label = "/v1/agents/bad%20label/heartbeat"
    headers = sign_request(provider, "shoal-test", "POST", label, BODY)
    assert httpx.post(served.url + label, content=BODY, headers={
        "content-type": "application/json", **headers}).status_code == 422


def test_beats_are_timed_under_their_route(served: Served):
    provider = Account.create()
    provider_with_agent(served.client(provider))
    assert send(served, *beat_request(provider)).status_code == 200
    assert send(served, *beat_request(Account.create())).status_code == 403  # not registered
    text = httpx.get(served.url + "/metrics").text
    route = 'route="/v1/agents/{agent_id}/heartbeat"'
    assert f'shoal_http_request_seconds_count{{method="POST",{route},status="200"}} 1.0' in text
    assert f'shoal_http_request_seconds_count{{method="POST",{route},status="403"}} 1.0' in text
    assert "shoal_agent_heartbeats_total 1.0" in text


def test_a_beat_given_up_before_its_batch_is_not_written(served: Served, store_url):
    provider = Account.create()
    provider_with_agent(served.client(provider))
    committer = GroupCommit(served.app.state.coordinator.engine, beats.take_beats,
                            linger_s=0.5, idle_s=0.2)
    kept, dropped = (beats.BeatNote(provider.address, "agent-a", [], 1.0e9, nonce=nonce,
                                    role_needed="provider") for nonce in ("kept-nonce", "dropped-nonce"))
    first, second = committer.submit(kept), committer.submit(dropped)
    assert second.cancel()  # its request went away while the batch lingered
    assert first.result(timeout=10).outcome is beats.BeatOutcome.noted
    assert nonce_rows(store_url, provider.address) & {"kept-nonce", "dropped-nonce"} == {"kept-nonce"}
    # The idle committer's thread ends; the next write starts it again.
    deadline = time.monotonic() + 5
    while committer._running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not committer._running
    again = beats.BeatNote(provider.address, "agent-a", [], 1.0e9, nonce="again-nonce",
                           role_needed="provider")
    assert committer.submit(again).result(timeout=10).outcome is beats.BeatOutcome.noted
