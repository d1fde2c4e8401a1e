"""The heartbeat's fast path keeps the door shut: a replayed beat is refused
even by a restarted coordinator, a demoted or foreign key cannot beat, and
many beats at once on SQLite all land (no "database is locked")."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from eth_account import Account

from shoal.coordinator import Coordinator
from shoal.client.identity import Signer, sign_request
from shoal.spec.coordinator import Grant, Heartbeat, Role
from tests.coordinator.conftest import Served, make_settings, provider_with_agent

BODY = Heartbeat().model_dump_json().encode()


def beat_request(account, agent_id: str = "agent-a") -> tuple[str, dict[str, str]]:
    target = f"/v1/agents/{agent_id}/heartbeat"
    return target, sign_request(account, "shoal-test", "POST", target, BODY)


def send(served: Served, target: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(served.url + target, content=BODY,
                      headers={"content-type": "application/json", **headers})


def last_seen(served: Served, agent_id: str = "agent-a") -> float:
    coordinator = served.app.state.coordinator
    return next(a.last_seen_s for a in coordinator.reads.agents() if a.agent_id == agent_id)


def test_a_replayed_beat_is_refused_even_after_a_restart(store_url, operator):
    provider = Account.create()
    coordinator = Coordinator(make_settings(store_url, operator))
    served = Served(coordinator)
    provider_with_agent(served.client(provider))
    target, headers = beat_request(provider)
    assert send(served, target, headers).status_code == 200
    served.stop()
    coordinator.engine.dispose()

    # The attacker captured the beat and replays it at the restarted coordinator, within the skew.
    again = Coordinator(make_settings(store_url, operator))
    served = Served(again)
    try:
        seen = last_seen(served)
        replay = send(served, target, headers)
        assert replay.status_code == 401 and "nonce" in replay.json()["detail"]
        assert last_seen(served) == seen
    finally:
        served.stop()
        again.engine.dispose()


def test_a_demoted_provider_cannot_beat_at_once(served: Served, operator):
    provider = Account.create()
    provider_with_agent(served.client(provider))
    assert send(served, *beat_request(provider)).status_code == 200
    served.client(operator).request("POST", "/v1/grants", Grant(
        address=provider.address, role=Role.verifier, name="demoted"))
    seen = last_seen(served)
    answer = send(served, *beat_request(provider))
    assert answer.status_code == 403 and "provider role" in answer.json()["detail"]
    assert last_seen(served) == seen


def test_a_provider_cannot_beat_for_another_providers_agent(served: Served):
    honest, mallory = Account.create(), Account.create()
    provider_with_agent(served.client(honest), "agent-a")
    provider_with_agent(served.client(mallory), "agent-m")
    seen = last_seen(served, "agent-a")
    assert send(served, *beat_request(mallory, "agent-a")).status_code == 403
    assert send(served, *beat_request(mallory, "agent-none")).status_code == 404
    assert last_seen(served, "agent-a") == seen  # a dead agent cannot be kept alive by another


def test_many_beats_at_once_all_land(served: Served):
    providers = [Account.create() for _ in range(8)]
    for i, account in enumerate(providers):
        provider_with_agent(served.client(account), f"agent-{i}")
    coordinator = served.app.state.coordinator
    start_s = coordinator.desk.now_s()

    def beat(i: int) -> None:
        account = providers[i % len(providers)]
        coordinator.participants.consume_nonce(Signer(account.address, f"nonce-{i:06d}", 0))
        coordinator.agents.heartbeat(account.address, f"agent-{i % len(providers)}", Heartbeat())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(beat, range(400)))  # raises what any beat raised
    assert all(a.last_seen_s >= start_s for a in coordinator.reads.agents())
