"""A lost agent's workers are reported exited to the job's host by the
coordinator that reaps the agent: with its machine, the agent's launcher is
gone too, and no one else would tell the membership authority (a paused
job's last state holder would then hold the job forever). A lease whose
worker never asks to join is ended even before the job's first epoch."""

from __future__ import annotations

import time

from eth_account import Account
from sqlalchemy.orm import Session

from shoal.coordinator import Coordinator
from shoal.elastic.gate_keys import GateKeys, lease_identity
from shoal.elastic.serve import RendezvousServer
from shoal.coordinator.db.schema import AgentRow, JobRow
from shoal.spec.coordinator import Heartbeat, JobSubmission, OfferTerms, Registration
from tests.coordinator.conftest import (
    TINY_JOB, Served, make_settings, provider_with_agent,
)
from tests.coordinator.test_proofs import publish

PRICE = 1_000_000


def offers_and_a_job(served, prices: dict[str, int], accounts: dict | None = None):
    """Each agent of `prices` offers one device at its price (as `accounts`' key where
    given); alice submits a two-worker job. Their clients, alice and the job."""
    clients = {}
    for agent, price in prices.items():
        clients[agent] = served.client((accounts or {}).get(agent) or Account.create())
        provider_with_agent(clients[agent], agent)
        clients[agent].post_offer(OfferTerms(offer_id=f"{agent}-d0", agent_id=agent,
                                             price_wei_per_s=price))
    alice = served.client(Account.create())
    alice.register(Registration(role="submitter", name="alice"))
    job = alice.submit(JobSubmission(name="tiny", job_file=TINY_JOB, workers=2,
                                     max_price_wei_per_s=2 * PRICE, budget_wei=10**12))
    return clients, alice, job


def leases_of(alice, job) -> dict[str, int]:
    return {lease.offer_id: lease.lease for lease in alice.job(job.job_id).leases}


def test_a_lost_agents_workers_are_reported_exited_to_the_jobs_host(served):
    co = served.app.state.coordinator
    clients, alice, job = offers_and_a_job(served, {"a": PRICE, "b": PRICE})
    served.app.state.rounds.once()
    leases = leases_of(alice, job)
    host = RendezvousServer("127.0.0.1")  # stands in for the job's host
    try:
        with Session(co.engine) as session, session.begin():
            session.get(JobRow, job.job_id).rendezvous = f"127.0.0.1:{host.port}"
        workers = {a: f"{a}-l{leases[f'{a}-d0']}-a0-w0" for a in ("a", "b")}
        publish(co, job.job_id, list(workers.values()), "start")
        assert host.rdzv.exited(list(workers.values())) == []

        clients["b"].heartbeat("b", Heartbeat())
        with Session(co.engine) as session, session.begin():  # a fell silent long ago
            session.get(AgentRow, "a").last_seen_s = time.time() - 3600
        co.supervision.started_s -= 60  # long up: losses count (not just back from a restart)
        assert co.supervision.reap_lost_agents() == ["a"]
        assert host.rdzv.exited(list(workers.values())) == [workers["a"]]  # b's is not
        (lost,) = [e for e in alice.events(job=job.job_id) if e.kind == "workers_lost"]
        assert lost.detail["workers"] == [workers["a"]]
    finally:
        host.close()


def test_a_squatter_cannot_hold_a_job_that_has_not_formed(store_url, operator):
    """s wins a lease on a two-worker job, beats and reports it running, and never lets a
    worker ask the job's host to join: the host waits for two workers, so the job would
    never form while s holds its seat. Past the grace s's lease ends (its offer withdrawn,
    its device freed for a replacement) as it would after the first epoch; a, whose
    worker asked to join and waits for its peer, keeps its lease."""
    co = Coordinator(make_settings(store_url, operator, member_grace_s=0.5))
    served = Served(co)
    host = RendezvousServer("127.0.0.1")  # stands in for the job's host
    try:
        clients, alice, job = offers_and_a_job(served, {"a": PRICE, "s": PRICE})
        served.app.state.rounds.once()
        leases = leases_of(alice, job)
        co.supervision.record_rendezvous(job.job_id, f"127.0.0.1:{host.port}")  # the host serves from now
        host.rdzv.request_join(f"a-l{leases['a-d0']}-a0-w0")
        assert co.attendance.hold_leases_to_membership(job.job_id) == []  # within the grace: nobody

        time.sleep(0.7)
        for agent, client in clients.items():
            client.heartbeat(agent, Heartbeat(running=(leases[f"{agent}-d0"],)))
        assert co.progress.membership(job.job_id) == []  # no epoch yet: the job has not formed
        assert co.attendance.hold_leases_to_membership(job.job_id) == [leases["s-d0"]]
        held = {lease.offer_id: lease for lease in alice.job(job.job_id).leases}
        assert held["s-d0"].ends_at_s is not None  # the squatter holds nothing now
        assert held["a-d0"].ends_at_s is None  # the honest worker waiting for a peer stays
        (withdrawn,) = [e for e in alice.events(job=None) if e.kind == "offer_withdrawn"]
        assert withdrawn.detail["offer_id"] == "s-d0"
        assert co.attendance.hold_leases_to_membership(job.job_id) == []  # a is not judged again
    finally:
        host.close()
        served.stop()
        co.hosts.stop_all()
        co.engine.dispose()


def test_a_provider_ended_for_staying_out_cannot_post_its_way_back_into_the_job(
        store_url, operator):
    """s, the cheapest device, squats a two-worker job; past the grace its lease ends. It
    posts the same offer again, still the cheapest: the next round must lease the job c's
    dearer device, not s again (s would otherwise hold the seat a grace at a time, and its
    leases eat the job's escrow). s stays free to serve other jobs."""
    co = Coordinator(make_settings(store_url, operator, member_grace_s=0.5))
    served = Served(co)
    host = RendezvousServer("127.0.0.1")
    try:
        squatter = Account.create()
        clients, alice, job = offers_and_a_job(
            served, {"a": PRICE, "s": PRICE // 2, "c": 2 * PRICE}, {"s": squatter})

        def round_with_everyone_heard():  # agents silent past agent_timeout_s are reaped
            for agent, client in clients.items():
                client.heartbeat(agent, Heartbeat())
            served.app.state.rounds.once()

        round_with_everyone_heard()
        leases = leases_of(alice, job)
        assert set(leases) == {"a-d0", "s-d0"}  # the two cheapest
        co.supervision.record_rendezvous(job.job_id, f"127.0.0.1:{host.port}")
        host.rdzv.request_join(f"a-l{leases['a-d0']}-a0-w0")
        time.sleep(0.7)
        assert co.attendance.hold_leases_to_membership(job.job_id) == [leases["s-d0"]]

        clients["s"].post_offer(OfferTerms(offer_id="s-d0", agent_id="s",
                                           price_wei_per_s=PRICE // 2))  # back, cheapest
        round_with_everyone_heard()
        live = {lease.offer_id for lease in alice.job(job.job_id).leases
                if lease.ends_at_s is None}
        assert live == {"a-d0", "c-d0"}  # s holds nothing of the job; the seat is c's
        (barred,) = [e for e in alice.events(job=job.job_id) if e.kind == "provider_barred"]
        assert barred.detail["provider"].lower() == squatter.address.lower()

        other = alice.submit(JobSubmission(name="other", job_file=TINY_JOB, workers=1,
                                           max_price_wei_per_s=2 * PRICE, budget_wei=10**12))
        round_with_everyone_heard()
        assert [lease.offer_id for lease in alice.job(other.job_id).leases] == ["s-d0"]
    finally:
        host.close()
        served.stop()
        co.hosts.stop_all()
        co.engine.dispose()


def test_a_lease_that_ends_loses_its_way_into_the_jobs_store(served):
    """s's lease ends (its offer withdrawn): its gate token, still a valid HMAC, is
    revoked at the next look, so its worker (or anyone it gave the token) can neither keep
    its connections to the job's store nor open new ones; a's stays good."""
    co = served.app.state.coordinator
    clients, alice, job = offers_and_a_job(served, {"a": PRICE, "s": PRICE})
    served.app.state.rounds.once()
    leases = leases_of(alice, job)
    keys = GateKeys.create_or_load(co.hosts.gate_dir(job.job_id))  # as the host's start does
    co.supervision.revoke_ended_leases(job.job_id)
    assert keys.revoked() == frozenset()
    clients["s"].withdraw_offer("s-d0")
    co.supervision.revoke_ended_leases(job.job_id)
    assert keys.revoked() == {lease_identity(leases["s-d0"])}
    assert keys.admits(lease_identity(leases["a-d0"]), keys.token(lease_identity(leases["a-d0"])))


def test_a_paused_jobs_leases_keep_its_store_while_their_workers_leave(served, monkeypatch):
    """A pause ends every lease at once; their workers vote on the step in flight and the
    last writes the job's state down. Cut off at once, that worker failed mid-vote and
    nothing was written: a pause's leases keep the store for PAUSE_LEAVE_S, then lose it."""
    from shoal.coordinator.services.supervision import PAUSE_LEAVE_S

    co = served.app.state.coordinator
    clients, alice, job = offers_and_a_job(served, {"a": PRICE, "b": PRICE})
    served.app.state.rounds.once()
    leases = leases_of(alice, job)
    keys = GateKeys.create_or_load(co.hosts.gate_dir(job.job_id))
    co.jobs.set_paused(alice.account.address, job.job_id, True)
    co.supervision.revoke_ended_leases(job.job_id)
    assert keys.revoked() == frozenset()
    later = co.desk.now_s() + PAUSE_LEAVE_S + 1
    monkeypatch.setattr(co.desk, "now_s", lambda: later)
    co.supervision.revoke_ended_leases(job.job_id)
    assert keys.revoked() == {lease_identity(lease) for lease in leases.values()}
