"""The reconciler asks the planner for a layout when a job's membership
changes, a service the coordinator holds.

Each time the job's host publishes an epoch with other members, the
coordinator describes them to `shoal.plan` as they are: each member's
device (its lease's offer, at the speed the agent's pre-flight measured and
the market holds it to; its memory; its agent's region) and the links
between them (from the round trips and bandwidth the coordinator's own
probe measured to each agent, else the per-region defaults), and the job's
model and batch. The plan it gets back (re-planned from the previous one,
so survivors keep their place) is kept and published: the predicted step
time and where it goes, the synchronization mode and codec the planner
would choose for these links, and the measured step time beside it.

What the runtime takes from it today: the layout of a data-parallel job is
every member in one group with shares by measured speed, which the
membership authority already publishes; pipeline stages are not executed
(the search is held to data parallelism), and a job's sync mode and codec
are fixed by its job file for the whole run (work records and replays are
bound to them). So where the planner would synchronize differently for the
members the job has now, the plan says so (`advice`) rather than switching
under the verifiers' feet.
"""

from __future__ import annotations

import logging
import re
import statistics
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.errors import NotFound
from shoal.coordinator.db.schema import AgentRow, JobRow, LeaseRow, OfferRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.progress import JobProgress
from shoal.spec.coordinator import COORDINATOR, JobStatus
from shoal.spec.events import JobPlanned
from shoal.spec.job import BYTE_VOCAB, JobSpec
from shoal.spec.plan import Cluster, Device, ModelProfile, Plan, SyncMode, gpt_profile
from shoal.spec.progress import JobPlanView
from shoal.spec.worker import WorkerId

log = logging.getLogger(__name__)
# FLOPs of one sample of the agents' pre-flight probe (a 256-512-256 MLP, forward and
# backward: 6 per weight): turns its measured samples/s into the planner's TFLOP/s.
PROBE_FLOPS_PER_SAMPLE = 6.0 * (256 * 512 + 512 * 256)
MEASURED_STEPS = 20  # the measured step time is the median of the last this many steps


class JobPlanning:
    """The plan of each running job's current members, made again when they change."""

    def __init__(self, store: Store, desk: MarketDesk, progress: JobProgress,
                 job_spec: Callable[[str, str | None], JobSpec]) -> None:
        """`job_spec`: a job's spec (the proof services'); `progress`: its membership
        and the step times its rank 0 reported."""
        self.store, self.desk, self.progress, self.job_spec = store, desk, progress, job_spec
        self._plans: dict[str, tuple[tuple[str, ...], Plan]] = {}  # job -> (members, plan)

    def plan_jobs(self) -> list[JobPlanView]:
        """Re-plan each running job whose membership changed since its last plan."""
        with self.store.read() as session:
            jobs = session.scalars(select(JobRow.job_id).where(
                JobRow.status == JobStatus.running.value)).all()
        out = []
        for job_id in jobs:
            try:
                view = self._plan_job(job_id)
            except Exception:  # noqa: BLE001 - a job the planner cannot describe stays unplanned
                log.exception("job %s: could not plan its membership", job_id)
                continue
            if view is not None:
                out.append(view)
        return out

    def job_plan(self, job_id: str) -> JobPlanView | None:
        """The job's latest plan, with its measured step time."""
        with self.store.read() as session:
            row = session.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"no job '{job_id}'")
        if row.plan is None:
            return None
        view = JobPlanView.model_validate(row.plan)
        return view.model_copy(update={"measured_step_s": self._measured_step_s(job_id, view.t)})

    # ------------------------------------------------------------ one job
    def _plan_job(self, job_id: str) -> JobPlanView | None:
        changes = self.progress.membership(job_id)
        if not changes or not changes[-1].members:
            return None
        latest = changes[-1]
        members = tuple(sorted(latest.members))
        known = self._plans.get(job_id)
        if known is not None and known[0] == members:
            return None
        with self.store.read() as session:
            job = session.get(JobRow, job_id)
            spec = self.job_spec(job_id, job.job_file)
            cluster = self._cluster(session, job_id, latest.members)
        if cluster is None:
            return None
        model = model_profile(spec)
        plan = _search(cluster, model, known[1] if known else None)
        self._plans[job_id] = (members, plan)
        view = JobPlanView(
            t=self.desk.now_s(), epoch=latest.epoch, members=latest.members, dp=plan.dp, pp=plan.pp,
            mode=plan.mode, inner_steps=plan.inner_steps, codec=plan.codec, slt=plan.slt,
            step_time_s=plan.step_time_s, compute_s=plan.breakdown.compute_s,
            exchange_s=plan.breakdown.exchange_s, unused=plan.unused,
            links="probed" if cluster.latency_ms is not None else "region defaults",
            advice=_advice(spec, plan))
        with self.desk.change() as session:
            session.get(JobRow, job_id).plan = view.model_dump(mode="json")
            record_event(session, view.t, COORDINATOR, JobPlanned(**view.model_dump()), job_id)
        log.info("job %s: planned epoch %d (%d members): %.4f s a step predicted, %s%s",
                 job_id, latest.epoch, len(latest.members), plan.step_time_s, plan.mode.value,
                 f"; {view.advice}" if view.advice else "")
        return view

    def _cluster(self, session: Session, job_id: str, members: tuple[str, ...]) -> Cluster | None:
        """The members' devices as the planner sees them; None if one is not a lease's."""
        devices, probes = [], []
        for worker in members:
            named = WorkerId.leased(worker)
            lease = session.get(LeaseRow, named.lease) if named is not None else None
            if lease is None or lease.job_id != job_id:
                log.debug("job %s: member %s is not a lease's worker; not planned", job_id, worker)
                return None
            offer = session.get(OfferRow, lease.offer_id)
            agent = session.get(AgentRow, offer.agent_id)
            measured = agent.devices[offer.device] if offer.device < len(agent.devices) else {}
            speed = float(measured.get("speed_samples_per_s") or 1.0)
            devices.append(Device(name=worker, region=_name(agent.region),
                                  tflops=max(speed * PROBE_FLOPS_PER_SAMPLE / 1e12, 1e-9),
                                  memory_gb=max(float(measured.get("memory_gb") or 1.0), 0.01)))
            probes.append((agent.agent_id, measured.get("rtt_ms"), measured.get("bandwidth_gbps")))
        if all(rtt is not None and bw for _, rtt, bw in probes):
            latency, bandwidth = _probed_links(probes)
            return Cluster(devices=tuple(devices), latency_ms=latency, bandwidth_gbps=bandwidth)
        return Cluster(devices=tuple(devices))

    def _measured_step_s(self, job_id: str, since: float) -> float | None:
        # The newest steps, not the job's first (a read of progress starts at step 0).
        steps = [p for p in self.progress.recent(job_id, MEASURED_STEPS + 1) if p.t >= since]
        gaps = [b.t - a.t for a, b in zip(steps, steps[1:]) if b.step == a.step + 1]
        return statistics.median(gaps) if gaps else None


def model_profile(spec: JobSpec) -> ModelProfile:
    """The job's GPT as the planner sees it (byte-level vocabulary, its global batch)."""
    m = spec.model
    return gpt_profile(spec.name, layers=m.layers, width=m.width, context=m.context,
                       vocab=BYTE_VOCAB, batch_samples=spec.global_batch,
                       micro_batch_samples=spec.micro_batch or 1)


def _search(cluster: Cluster, model: ModelProfile, previous: Plan | None) -> Plan:
    from shoal.plan import SearchConfig, plan, replan

    # Data parallel over every member: the runtime runs no pipeline stages, and the market,
    # not the planner, decides which leases a job holds.
    config = SearchConfig(only_shapes=((len(cluster.devices), 1),))
    if previous is not None:
        return replan(previous, cluster, model, config)
    return plan(cluster, model, config)


def _probed_links(probes: list[tuple[str, Any, Any]]) -> tuple[tuple[tuple[float, ...], ...], ...]:
    """Pairwise links from each agent's probe of the coordinator: one way to the coordinator
    and on to the other (half of each round trip), at the slower of the two links; devices
    of one agent share its machine (the region's own defaults, as fast as any probe)."""
    n = len(probes)
    latency = [[0.0] * n for _ in range(n)]
    bandwidth = [[0.0] * n for _ in range(n)]
    for i, (agent_i, rtt_i, bw_i) in enumerate(probes):
        for j, (agent_j, rtt_j, bw_j) in enumerate(probes):
            if i == j:
                continue
            same = agent_i == agent_j
            latency[i][j] = 0.0 if same else (float(rtt_i) + float(rtt_j)) / 2
            bandwidth[i][j] = max(float(bw_i), float(bw_j)) if same else min(float(bw_i),
                                                                             float(bw_j))
    return (tuple(tuple(r) for r in latency), tuple(tuple(r) for r in bandwidth))


def _advice(spec: JobSpec, plan: Plan) -> str:
    """A sentence when the planner would synchronize these members otherwise than the job."""
    sync = spec.sync
    if plan.mode is sync.mode and plan.codec is sync.codec and plan.slt == sync.slt and (
            plan.mode is SyncMode.allreduce or plan.inner_steps == sync.inner_steps):
        return ""
    would = plan.mode.value + (f" with inner_steps = {plan.inner_steps}"
                               if plan.mode is SyncMode.diloco else "")
    would += f", slt = {plan.slt}" if plan.slt else ""
    runs = sync.mode.value + (f", slt {sync.slt}" if sync.slt else "")
    return (f"for these members' links the planner would run {would} and codec "
            f"'{plan.codec.value}', at {plan.step_time_s:.3g} s a step predicted (the job runs "
            f"{runs}, codec '{sync.codec.value}', fixed for the run: set [sync] in "
            "the job file for the next one)")


def _name(region: str) -> str:
    """A region as the planner names things (letters, digits, . _ -)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", region)[:64]
    return cleaned or "default"
