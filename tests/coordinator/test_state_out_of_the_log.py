"""The audit log is served, never read back as state: each thing the coordinator once
found by searching its events (when a job's host began serving, its latest plan, which
leases stored records lately, a settlement's failed tries) survives the log's rows
deleted, because it lives in columns of its own."""

from __future__ import annotations

import time

from sqlalchemy import delete
from sqlalchemy.orm import Session

from shoal.coordinator import Coordinator
from shoal.coordinator.db.schema import EventRow, SettlementRow
from shoal.coordinator.services import chain_jobs
from shoal.elastic.serve import RendezvousServer
from shoal.ledger.errors import ChainUnavailable
from shoal.spec.coordinator import Heartbeat
from tests.coordinator.conftest import Served, make_settings
from tests.coordinator.test_attendance import PRICE, leases_of, offers_and_a_job
from tests.coordinator.test_job_planning import market, worker
from tests.coordinator.test_proofs import publish
from tests.coordinator.test_records_grace import _file, lagging  # noqa: F401
from tests.coordinator.test_settlement_attacks import stage  # noqa: F401


def forget_the_log(co: Coordinator) -> None:
    with Session(co.engine) as session, session.begin():
        session.execute(delete(EventRow))


def test_a_jobs_plan_outlives_its_planned_event(served):
    co = served.app.state.coordinator
    submitter, job_id, leases = market(served, {"eu1": "eu", "us1": "us"}, 2)
    publish(co, job_id, [worker("eu1", leases), worker("us1", leases)], "start")
    (planned,) = co.planning.plan_jobs()
    forget_the_log(co)
    kept = submitter.job_plan(job_id)
    assert (kept.epoch, kept.dp, kept.mode) == (planned.epoch, planned.dp, planned.mode)


def test_the_grace_of_a_job_not_formed_runs_from_its_host_serving_without_the_log(
        store_url, operator):
    """A squatter's grace runs from when the host began serving: with that time forgotten
    the squatter would never be judged."""
    co = Coordinator(make_settings(store_url, operator, member_grace_s=0.5))
    served = Served(co)
    host = RendezvousServer("127.0.0.1")  # stands in for the job's host
    try:
        clients, alice, job = offers_and_a_job(served, {"a": PRICE, "s": PRICE})
        served.app.state.rounds.once()
        leases = leases_of(alice, job)
        co.supervision.record_rendezvous(job.job_id, f"127.0.0.1:{host.port}")
        host.rdzv.request_join(f"a-l{leases['a-d0']}-a0-w0")
        forget_the_log(co)
        time.sleep(0.7)
        for agent, client in clients.items():
            client.heartbeat(agent, Heartbeat(running=(leases[f"{agent}-d0"],)))
        assert co.attendance.hold_leases_to_membership(job.job_id) == [leases["s-d0"]]
    finally:
        host.close()
        served.stop()
        co.hosts.stop_all()
        co.engine.dispose()


def test_the_leases_storing_records_lately_are_known_without_the_log(lagging):  # noqa: F811
    """b stopped storing records long ago: the job's step is a's newest alone, not held
    back to b's (which it would be, were the recent stores forgotten)."""
    served, co, clock, a, b, job_id, leases = lagging
    wa, wb = (f"agent-{n}-l{leases[n]}-a0-w0" for n in "ab")
    _file(a, job_id, leases["a"], wa, 0, range(11))
    _file(b, job_id, leases["b"], wb, 1, range(3))
    clock.offset += 3 * co.settings.agent_timeout_s
    _file(a, job_id, leases["a"], wa, 0, range(11, 16))
    forget_the_log(co)
    with Session(co.engine) as session:
        assert co.records.reached_step(session, job_id) == 15


def test_a_failed_settlement_is_retried_without_the_log(stage, monkeypatch):  # noqa: F811
    s = stage()
    monkeypatch.setattr(chain_jobs, "SETTLE_RETRY_S", 0.0, raising=False)
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, 10**12).returned
    clients = s.providers()
    job = s.working(clients, chain_job)
    real_settle = s.coordinator.settlement.settle

    def fail_once(*args, **kwargs):
        monkeypatch.setattr(s.coordinator.settlement, "settle", real_settle)
        raise ChainUnavailable("the chain did not answer")

    monkeypatch.setattr(s.coordinator.settlement, "settle", fail_once)
    time.sleep(1)
    s.submitter.job_action(job.job_id, "cancel")
    assert not s.ledger.job(chain_job).settled_at
    forget_the_log(s.coordinator)

    s.rounds()
    assert s.ledger.job(chain_job).settled_at
    with Session(s.coordinator.engine) as session:
        tries = session.get(SettlementRow, job.job_id)
        assert (tries.failures, tries.settled_at_s is not None) == (1, True)
    s.rounds()  # settled: never tried again
    assert len(s.events(job.job_id, "job_settled")) == 1
