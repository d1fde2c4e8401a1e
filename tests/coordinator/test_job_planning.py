"""The reconciler asks the planner for a layout when a job's membership
changes: the members' devices as measured, their regions, their links as
the coordinator's probes saw them (else region defaults), re-planned from
the previous plan; published with what the planner would do differently."""

from __future__ import annotations

from eth_account import Account
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import AgentRow
from shoal.spec.coordinator import JobSubmission, OfferTerms, Registration
from shoal.spec.plan import Codec, SyncMode
from tests.coordinator.conftest import TINY_JOB, provider_with_agent
from tests.coordinator.test_proofs import publish

PRICE = 1_000_000


def market(served, regions: dict[str, str], workers: int):
    submitter = served.client(Account.create())
    for agent, region in regions.items():
        client = served.client(Account.create())
        provider_with_agent(client, agent, speed=20_000.0, region=region)
        client.post_offer(OfferTerms(offer_id=f"dev-{agent}", agent_id=agent,
                                     price_wei_per_s=PRICE))
    submitter.register(Registration(role="submitter", name="alice"))
    job = submitter.submit(JobSubmission(name="tiny", job_file=TINY_JOB, workers=workers,
                                         max_price_wei_per_s=2 * PRICE, budget_wei=10**12))
    served.app.state.rounds.once()
    leases = {lease.offer_id: lease.lease for lease in submitter.job(job.job_id).leases}
    return submitter, job.job_id, leases


def worker(agent: str, leases: dict[str, int]) -> str:
    return f"{agent}-l{leases[f'dev-{agent}']}-a0-w0"


def test_a_membership_change_is_planned_once_and_the_plan_says_what_it_would_do(served):
    co = served.app.state.coordinator
    submitter, job_id, leases = market(served, {"eu1": "eu", "us1": "us", "us2": "us"}, 3)
    assert submitter.job_plan(job_id) is None  # no membership yet: nothing to plan
    publish(co, job_id, [worker("eu1", leases), worker("us1", leases)], "start")
    (first,) = co.planning.plan_jobs()
    assert (first.epoch, first.dp, first.pp, first.links) == (0, 2, 1, "region defaults")
    # Across regions (80 ms, 1 Gbit/s by default) a tiny model's every-step exchange is all
    # latency: the planner would rather take many local steps between exchanges.
    assert first.mode is SyncMode.diloco and first.inner_steps > 1
    assert "diloco" in first.advice and "the job runs allreduce" in first.advice
    assert co.planning.plan_jobs() == []  # the same members: not planned again
    assert submitter.job_plan(job_id).epoch == 0

    publish(co, job_id, [worker(a, leases) for a in ("eu1", "us1", "us2")], "join")
    (second,) = co.planning.plan_jobs()
    assert (second.epoch, second.dp, len(second.members)) == (1, 3, 3)
    planned = [e for e in submitter.events(job=job_id) if e.kind == "job_planned"]
    assert [e.detail["epoch"] for e in planned] == [0, 1]


def test_links_come_from_the_coordinators_own_probes_when_every_agent_has_one(served):
    co = served.app.state.coordinator
    submitter, job_id, leases = market(served, {"a1": "eu", "a2": "eu"}, 2)
    with Session(co.engine) as session, session.begin():
        for agent_id, rtt, bandwidth in (("a1", 0.2, 10.0), ("a2", 0.2, 10.0)):
            row = session.get(AgentRow, agent_id)
            row.devices = [{**d, "rtt_ms": rtt, "bandwidth_gbps": bandwidth} for d in row.devices]
    publish(co, job_id, [worker("a1", leases), worker("a2", leases)], "start")
    (fast,) = co.planning.plan_jobs()
    assert fast.links == "probed" and fast.dp == 2

    with Session(co.engine) as session, session.begin():
        row = session.get(AgentRow, "a2")  # a2 comes back from behind a slow link
        row.devices = [{**d, "rtt_ms": 300.0, "bandwidth_gbps": 0.01} for d in row.devices]
    publish(co, job_id, [worker("a1", leases)], "exit")
    (alone,) = co.planning.plan_jobs()
    assert alone.dp == 1 and alone.exchange_s == 0.0
    publish(co, job_id, [worker("a1", leases), worker("a2", leases)], "join")
    (slow,) = co.planning.plan_jobs()
    assert slow.links == "probed" and slow.epoch == 2
    # The planner saw the slow link: more local steps between exchanges, and a compressed
    # one or one in the background, applied late (bounded staleness, said in the advice).
    assert slow.inner_steps > fast.inner_steps
    assert slow.codec is not Codec.none or slow.slt > 0
    assert slow.slt == 0 or f"slt = {slow.slt}" in slow.advice  # the job runs slt 0
    assert fast.slt == 0


def test_the_measured_step_time_is_the_newest_steps_pace(served):
    """Past the first read's worth of steps, the measured pace beside a plan is still the
    job's latest one (a read of progress from the start would stop at its first steps)."""
    from shoal.coordinator.services.progress import MAX_STEPS_PER_READ
    from shoal.coordinator.db.schema import StepProgressRow

    co = served.app.state.coordinator
    submitter, job_id, leases = market(served, {"a1": "eu"}, 1)
    publish(co, job_id, [worker("a1", leases)], "start")
    (planned,) = co.planning.plan_jobs()
    steps = MAX_STEPS_PER_READ + 100
    with Session(co.engine) as session, session.begin():
        session.add_all(StepProgressRow(  # 0.1 s a step, then 0.5 s for the last 50
            job_id=job_id, step=i, t=planned.t + 0.1 * min(i, steps - 50) + 0.5 * max(
                0, i - (steps - 50)), loss=1.0, world=1, samples=8, worker="w")
            for i in range(steps))
    assert abs(submitter.job_plan(job_id).measured_step_s - 0.5) < 1e-6

