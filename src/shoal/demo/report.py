"""The demo's report, read from what the run left: the coordinator's store
and audit log, every worker's step log, the job host's epochs and final
figures, and the chain.

Faults are judged from the step logs with the arithmetic the elastic
benchmarks use (`shoal.elastic.recovery`): recovery is from the fault until
steps run at 90% of the steady rate of the world that follows; a step is
lost when it was committed before the fault and again in a later epoch.
EF compares this run with a static on-demand run of the same job: the
same number of workers, never faulted, at the on-demand reference price,
its pace estimated from this run's own fault-free full-world steps.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from shoal.coordinator.proofs.penalties import (
    FALSE_ACCUSATION_PENALTY_WEI, LAZY_VERDICT_PENALTY_WEI,
)
from shoal.demo.runner import Demo
from shoal.elastic.report import coverage, lineage, redone_steps
from shoal.elastic.recovery import recovery_s
from shoal.spec.demo import (
    AnchorReport, DemoReport, EfficiencyReport, EventKind, FaultReport, ProviderReport,
    SlashReport,
)
from shoal.spec.elastic import StepRecord
from shoal.spec.events import EventKind as AuditKind  # spec.demo's EventKind is a scenario's
from shoal.train.step_log import read_step_logs

END_STEPS = 20  # a fault with fewer committed steps after it came as the job ended
FAULT_NAMES = {EventKind.preempt: "preemption", EventKind.kill: "kill", EventKind.join: "join"}


def step_records(run_dir: Path) -> list[StepRecord]:
    """Every worker's step log, from every agent's lease runs."""
    records: list[StepRecord] = []
    for folder in sorted(run_dir.glob("agents/*/lease-*/run-*")):
        records += read_step_logs(folder)
    return records


def build_report(demo: Demo) -> DemoReport:
    co, job_id, chain = demo.coordinator, demo.state.job_id, demo.chain
    started = demo.state.started_t or 0.0
    records = step_records(demo.run_dir)
    steps = lineage(records)
    _, skipped, duplicated = coverage(steps)
    events = job_events(co, job_id)
    progress = co.progress.steps(job_id)
    final = json.loads((co.hosts.run_dir(job_id) / "final.json").read_text()).get("final", {})

    faults = [_fault(f.event.provider, FAULT_NAMES[f.event.kind], f.t, started, records, steps)
              for f in demo.state.fired]
    slashes = []
    names = {address: name for name, address in demo.addresses.items()}
    for e in events:
        if e.kind == AuditKind.worker_slashed:
            provider = str(e.detail.get("provider"))
            name = names.get(provider, provider)
            faults.append(_fault(name, "cheat", e.at_s, started, records, steps,
                                 detail=str(e.detail.get("why", ""))))
            slashes.append(SlashReport(provider=name, address=provider,
                                       amount_wei=_slashed_wei(chain, provider),
                                       tx=e.detail.get("tx"), why=str(e.detail.get("why", ""))))
    faults.sort(key=lambda f: f.at_s)

    job = co.reads.job(job_id)
    providers = [_provider(demo, p, job, progress) for p in demo.scenario.providers]
    gas, fees = chain.gas()
    budget = demo.scenario.budget_wei
    # Spent: what the providers were credited for the job (the fee is 0 in the demo's
    # contract); the submitter's credit also holds its share of a slash, not escrow.
    spent = sum(demo.credited.values())
    wall = (progress[-1].t - progress[0].t) if len(progress) > 1 else 0.0
    verdicts: dict[str, int] = {}
    rechecked = 0
    for v in co.verdicts.of_job(job_id):
        verdicts[v.verdict.kind.value] = verdicts.get(v.verdict.kind.value, 0) + 1
        rechecked += v.verdict.verifier.lower() == demo.whistleblower.address.lower()
    verifier_slashes = tuple(_verifier_slash(e) for e in events if e.kind in VERIFIER_PENALTIES)
    return DemoReport(
        scenario=demo.scenario.name, job_id=job_id, chain_job=demo.chain_job,
        started_at=started, wall_s=round(wall, 2), steps=len(steps),
        val_loss=final.get("val_loss"), samples_skipped=skipped, samples_duplicated=duplicated,
        faults=tuple(faults), slashes=tuple(slashes), providers=tuple(providers),
        eta_het=_eta_het(co, job_id, progress), ef=_ef(demo, progress, wall, spent),
        budget_wei=budget, spent_wei=spent, refunded_wei=budget - spent,
        conserved=chain.start_total - chain.total() == fees, gas=gas,
        store_chain_agree=_store_chain_agree(demo, events),
        anchors=tuple(AnchorReport(epoch=e.epoch, root=e.root, anchored=e.anchored_root,
                                   tx=e.anchor_tx)
                      for e in co.records.proof_epochs(job_id)),
        progress=tuple(progress), membership=tuple(co.progress.membership(job_id)),
        verdicts=verdicts,
        rechecked=rechecked, verifier_slashes=verifier_slashes)


def job_events(co, job_id: str | None) -> list:  # noqa: ANN001 - a Coordinator; its Events
    """Every event of the job, oldest first. A quick demo records some 900 and the full
    one several thousand: the settlement and the verifiers' penalties come last, and a
    first page alone would leave them out of the report."""
    events, after = [], 0
    while page := co.reads.events(job_id, after=after, limit=1000):
        events += page
        after = page[-1].seq
    return events


def _store_chain_agree(demo: Demo, events) -> bool:  # noqa: ANN001
    settled = [e for e in events if e.kind == AuditKind.job_settled]
    if len(settled) != 1:
        return False
    booked = settled[0].detail.get("seconds", {})
    return all(demo.booked.get(address, 0) == int(booked.get(address, 0))
               for address in demo.addresses.values())


def _fault(provider: str, kind: str, t: float, started: float, records: list[StepRecord],
           steps: list[StepRecord], detail: str = "") -> FaultReport:
    spans = [(r.t_start, r.t_commit) for r in steps]
    redone = redone_steps(records, t)
    recovery = recovery_s(spans, t) if kind != "join" else None
    after = sum(1 for r in steps if r.t_start >= t)
    return FaultReport(kind=kind, provider=provider, at_s=round(t - started, 2),
                       recovery_s=None if recovery is None else round(recovery, 3),
                       steps_lost=len(redone), detail=detail,
                       after_end=recovery is None and after < END_STEPS)


# Events of a verifier losing stake: a `valid` a replay showed wrong, a false accusation
# (only with a transaction: an accusation is rejected, and the accuser pays, on chain), a
# planted record signed `valid`.
VERIFIER_PENALTIES = {
    AuditKind.verifier_slashed: "signed valid on {worker} step {step}",
    AuditKind.verdict_rejected: "accused {worker} step {step} falsely: {why}",
    AuditKind.forced_error_missed: "signed valid on a planted record ({worker} step {step})",
}


def _verifier_slash(event) -> SlashReport:  # noqa: ANN001 - an EventView
    d = event.detail
    tx = d.get("tx")
    penalty = FALSE_ACCUSATION_PENALTY_WEI if event.kind == AuditKind.verdict_rejected \
        else LAZY_VERDICT_PENALTY_WEI
    return SlashReport(provider="verifier", address=str(d.get("verifier")),
                       amount_wei=penalty if tx else 0, tx=tx,
                       why=VERIFIER_PENALTIES[event.kind].format(
                           worker=d.get("worker"), step=d.get("step"), why=d.get("why")))


def _slashed_wei(chain, provider: str) -> int:  # noqa: ANN001 - DemoChain
    from shoal.demo.chain import STAKE_WEI

    stake = chain.ledger.stake_of(provider)
    return max(0, STAKE_WEI - stake.active_wei - stake.unbonding_wei)


def _provider(demo: Demo, p, job, progress) -> ProviderReport:  # noqa: ANN001
    address = demo.addresses[p.name]
    leased = sum(((lease_.ends_at_s or progress[-1].t) - lease_.start_s)
                 for lease_ in job.leases if lease_.offer_id.startswith(f"{p.name}-"))
    return ProviderReport(
        name=p.name, address=address, tenancy=p.tenancy.value, price_wei_per_s=p.price_wei_per_s,
        speed_samples_per_s=_speed(demo, p.name), leased_s=round(max(0.0, leased), 2),
        steps=_steps_of(demo, p.name),
        paid_wei=demo.credited.get(address, 0),
        slashed_wei=_slashed_wei(demo.chain, address) if address in demo.slashed else 0,
        cheated=p.adversary is not None)


def _speed(demo: Demo, name: str) -> float:
    for agent in demo.coordinator.reads.agents():
        if agent.agent_id == name and agent.devices:
            return round(agent.devices[0].speed_samples_per_s, 1)
    return 0.0


def _steps_of(demo: Demo, name: str) -> int:
    records = []
    for folder in demo.run_dir.glob(f"agents/{name}/lease-*/run-*"):
        records += read_step_logs(folder)
    return len({r.step for r in records})


def _throughputs(progress) -> list[tuple[int, float]]:  # noqa: ANN001
    """(world, samples/s) between consecutive commits."""
    out = []
    for a, b in zip(progress, progress[1:]):
        if b.t > a.t and b.step == a.step + 1:
            out.append((b.world, b.samples / (b.t - a.t)))
    return out


def _eta_het(co, job_id: str, progress) -> float | None:  # noqa: ANN001
    """Achieved samples/s over the sum of the members' own measured speeds, in the
    membership epoch with the most steps (the job host's last speeds)."""
    speeds_path = co.hosts.run_dir(job_id) / "speeds.json"
    if not speeds_path.exists():
        return None
    speeds = json.loads(speeds_path.read_text())
    members = len(speeds.get("speeds", {}))
    rates = [r for world, r in _throughputs(progress) if world == members]
    total = sum(speeds.get("speeds", {}).values())
    if len(rates) < 5 or total <= 0:
        return None
    return round(statistics.median(rates) / total, 3)


def _ef(demo: Demo, progress, wall_s: float, cost_wei: int) -> EfficiencyReport | None:  # noqa: ANN001
    workers = demo.scenario.workers
    on_demand = demo.coordinator.settings.price_table().on_demand_wei_per_s("cpu") or 0
    if wall_s <= 0 or cost_wei <= 0:
        return None
    static = [r.t_commit for r in read_step_logs(demo.run_dir / "static" / "run")] \
        if demo.static_report is not None else []
    if len(static) > 1:
        # The same span as this run's: first committed step to last (start-up excluded).
        return _efficiency(max(static) - min(static), wall_s, cost_wei, workers, on_demand, True,
                           f"measured: the same job on {workers} workers of this machine "
                           f"started together and never faulted (shoal train --workers "
                           f"{workers}), billed at the on-demand reference price of "
                           f"{on_demand} wei/s each")
    paces = _throughputs(progress)
    widest = max((world for world, _ in paces), default=0)
    per_worker = [r / world for world, r in paces if world == widest]
    if len(per_worker) < 5:
        return None
    rate = statistics.median(per_worker) * workers  # a static world of `workers` at this pace
    return _efficiency(sum(p.samples for p in progress) / rate, wall_s, cost_wei, workers,
                       on_demand, False,
                       f"estimated: {workers} on-demand cpu workers at {on_demand} wei/s each, "
                       f"never faulted, each at this run's median pace per worker in its "
                       f"widest world ({widest} workers): {rate:.1f} samples/s")


def _efficiency(static_wall: float, wall_s: float, cost_wei: int, workers: int, on_demand: int,
                measured: bool, how: str) -> EfficiencyReport:
    static_cost = int(static_wall * workers * on_demand)
    return EfficiencyReport(
        time=round(static_wall / wall_s, 3), cost=round(static_cost / cost_wei, 3),
        static_wall_s=round(static_wall, 2), static_cost_wei=static_cost,
        measured=measured, how=how)
