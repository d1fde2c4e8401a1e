"""How each job is doing, a service the coordinator holds: agents send the committed
steps their worker logged while it was rank 0 (loss, world, batch), and the
job host's membership epochs are read from its run directory. What a
dashboard or a report draws its curves and timelines from, and nothing more:
a report is one provider's word, so no pay or proof reads it (how far a job
got is its host's word, `ProofRecords.host_reached`)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select

from shoal.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.coordinator.db.schema import JobRow, StepProgressRow
from shoal.coordinator.db.store import Store
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.providers import own_lease
from shoal.spec.job import JobSpec
from shoal.spec.progress import MembershipChange, ProgressUpload, StepProgress
from shoal.spec.worker import runs_on

MAX_STEPS_PER_READ = 5000


class JobProgress:
    """Each job's committed steps as its rank 0 reported them, and its membership epochs."""

    def __init__(self, store: Store, desk: MarketDesk,
                 job_spec: Callable[[str, str | None], JobSpec],
                 published_changes: Callable[[str], list[MembershipChange]]) -> None:
        """`job_spec`: a job's spec, from its job file; `published_changes`: the membership
        changes its host published, read incrementally (the job specs' and the proof records')."""
        self.store, self.desk = store, desk
        self.job_spec, self.published_changes = job_spec, published_changes

    def record(self, provider: str, job_id: str, upload: ProgressUpload) -> int:
        """Store the steps not known yet; the number stored. The first report of a step
        stands (every member logs the same loss; only rank 0's agent sends it)."""
        with self.desk.change() as session:
            lease, agent_id = own_lease(session, provider, job_id, upload.lease)
            if not runs_on(upload.worker, agent_id, lease.lease):
                raise Forbidden(f"worker '{upload.worker}' is not on lease {upload.lease}")
            last = self.job_spec(job_id, session.get(JobRow, job_id).job_file).steps - 1
            if any(p.step > last for p in upload.steps):
                raise Conflict(f"a progress report names a step past the job's last ({last})")
            steps = {p.step: p for p in upload.steps}
            known = set(session.scalars(select(StepProgressRow.step).where(
                StepProgressRow.job_id == job_id, StepProgressRow.step.in_(list(steps)))))
            for step, p in steps.items():
                if step not in known:
                    session.add(StepProgressRow(job_id=job_id, step=step, t=p.t, loss=p.loss,
                                                world=p.world, samples=p.samples,
                                                worker=upload.worker))
            return len(steps) - len(known)

    def steps(self, job_id: str, after: int = -1) -> list[StepProgress]:
        with self.store.read() as session:
            if session.get(JobRow, job_id) is None:
                raise NotFound(f"no job '{job_id}'")
            rows = session.scalars(select(StepProgressRow).where(
                StepProgressRow.job_id == job_id, StepProgressRow.step > after)
                .order_by(StepProgressRow.step).limit(MAX_STEPS_PER_READ))
            return [StepProgress(step=r.step, t=r.t, loss=r.loss, world=r.world,
                                 samples=r.samples) for r in rows]

    def recent(self, job_id: str, count: int) -> list[StepProgress]:
        """The job's last `count` committed steps, in step order."""
        with self.store.read() as session:
            rows = session.scalars(select(StepProgressRow).where(StepProgressRow.job_id == job_id)
                                   .order_by(StepProgressRow.step.desc()).limit(count)).all()
            return [StepProgress(step=r.step, t=r.t, loss=r.loss, world=r.world,
                                 samples=r.samples) for r in reversed(rows)]

    def membership(self, job_id: str) -> list[MembershipChange]:
        with self.store.read() as session:
            if session.get(JobRow, job_id) is None:
                raise NotFound(f"no job '{job_id}'")
        return self.published_changes(job_id)
