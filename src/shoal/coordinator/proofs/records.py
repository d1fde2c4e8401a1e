"""Proof of learning through the coordinator, a service it holds: work records
and proof epochs. Agents upload their workers' work records; the
coordinator roots each proof epoch once (a Merkle root over its records, in
(step, worker) order) and anchors it on the job's chain escrow. Challenges
are `challenges.py`, verdicts `verdicts.py`; the referee's rulings are `referee.py`.

Records are commitments: one stored for (job, worker, step) is never
replaced (but by the same step redone in a later membership epoch, before
its epoch is rooted), and a record arriving after its epoch was rooted is
refused. A worker may only speak for itself: its id
must parse (`spec.worker.WorkerId`) to that lease and the agent that runs it,
and the agent must be the caller's; and only for the seat it
held: the membership epoch, rank and world a record claims must be those the
job's host published (`published_epochs.py`).

How far a job got, which decides what its records owe and when an epoch is
rooted, is its host's word (`job_host.read_reached`: the step every member
committed), never one provider's: a record or a progress report may name any
step, and a few colluding leases naming a step far ahead must neither root
epochs whose steps have not run nor make honest workers owe records of them.
"""

from __future__ import annotations

import logging
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import JobRow, LeaseRow, ProofEpochRow, WorkRecordRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.coordinator.proofs.forced_plans import anchored_value
from shoal.coordinator.proofs.published_epochs import PublishedEpochs
from shoal.coordinator.proofs.views import epoch_view
from shoal.coordinator.services.job_hosts import JobHosts
from shoal.coordinator.services.job_specs import JobSpecs
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.providers import own_lease
from shoal.coordinator.services.settlement import Settlement
from shoal.coordinator.settings import CoordinatorSettings
from shoal.elastic.job_host import read_reached
from shoal.ledger import LedgerError
from shoal.proof.dues import Dues, record_dues
from shoal.proof.epochs import epoch_of, final_lineage, is_complete, steps_of
from shoal.proof.merkle import epoch_tree
from shoal.spec.audit import ProofEpochView, RecordUpload, UploadReceipt
from shoal.spec.coordinator import COORDINATOR, JobStatus
from shoal.spec.errors import SpecError
from shoal.spec.events import ProofEpochRooted, WorkRecordsStored
from shoal.spec.job import JobSpec
from shoal.spec.plan import SyncMode
from shoal.spec.proof import WorkRecord
from shoal.spec.worker import WorkerId, runs_on

log = logging.getLogger(__name__)
# An epoch whose records are still incomplete is rooted anyway once the job (by its
# host's word and its records both) is this many epochs beyond it: a worker lost with
# its agent never uploads the steps it had not sent, and the job must not wait for it
# forever.
ROOT_AFTER_EPOCHS = 2
RECORDS_GRACE_BEATS = 5  # how long a finished job waits for its last records, in heartbeats


class ProofRecords:
    """The jobs' work records, their proof epochs (rooted and anchored), and what each
    lease owed of them."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 specs: JobSpecs, hosts: JobHosts, settlement: Settlement | None) -> None:
        """`hosts`: the job hosts, whose run directories hold each job's published
        membership and how far its members got; `settlement` None: nothing is anchored."""
        self.store, self.desk, self.settings = store, desk, settings
        self.specs, self.hosts, self.settlement = specs, hosts, settlement
        self.published = PublishedEpochs(hosts.run_dir)
        self._final_seen: dict[str, float] = {}  # job -> when its host's final word was first read
        # (job, epoch) -> when the job was first seen to have left the epoch behind with
        # records missing (in memory: after a restart the grace only starts again).
        self._behind_seen: dict[tuple[str, int], float] = {}

    def proof_dir(self, job_id: str) -> Path:
        """The job's answered challenges, laid out as a `ProofLayout` (params/, reveal/)."""
        return self.settings.data_dir / "proof" / job_id

    # ------------------------------------------------------------ records (agents)
    def upload_records(self, provider: str, job_id: str, upload: RecordUpload) -> UploadReceipt:
        with self.desk.change() as session:
            now = self.desk.now_s()
            job = self.proof_job(session, job_id)
            spec = self.specs.job_spec(job_id, job.job_file)
            lease, agent_id = own_lease(session, provider, job_id, upload.lease)
            rooted = session.scalar(select(func.max(ProofEpochRow.epoch))
                                    .where(ProofEpochRow.job_id == job_id))
            stored = known = 0
            for record in upload.records:
                _check_record(record, spec, agent_id, lease.lease, rooted)
                self.published.check(job_id, record)
                body = record.model_dump(mode="json")
                row = session.get(WorkRecordRow, (job_id, record.worker, record.step))
                if row is not None:
                    stored_epoch = row.body.get("membership_epoch", 0)
                    if row.body == body:
                        known += 1
                        continue
                    if record.membership_epoch <= stored_epoch:
                        raise Conflict(f"a different record for {record.worker} step {record.step} "
                                       "is already stored; records are commitments and never change")
                    # The step was redone after a restore (a later membership epoch) before
                    # its proof epoch was rooted: the newer lineage's record stands.
                    row.body, row.lease, row.agent_id = body, lease.lease, agent_id
                    stored += 1
                    continue
                session.add(WorkRecordRow(job_id=job_id, worker=record.worker, step=record.step,
                                          lease=lease.lease, provider=provider, agent_id=agent_id,
                                          body=body))
                stored += 1
            if stored:
                steps = [r.step for r in upload.records]
                lease.records_stored_at_s = now
                record_event(session, now, provider, WorkRecordsStored(
                    lease=lease.lease, records=stored, steps=(min(steps), max(steps))), job_id)
            return UploadReceipt(stored=stored, known=known)

    def proof_job(self, session: Session, job_id: str) -> JobRow:
        """The job's row; NotFound for no such job, Conflict for one that keeps no records."""
        job = session.get(JobRow, job_id)
        if job is None:
            raise NotFound(f"no job '{job_id}'")
        if not self.specs.job_spec(job_id, job.job_file).proof.enabled:
            raise Conflict(f"job '{job_id}' keeps no work records ([proof] enabled = false)")
        return job

    def work_records(self, job_id: str, epoch: int | None = None) -> list[WorkRecord]:
        spec = self.specs.job_spec(job_id)
        with self.store.read() as session:
            query = select(WorkRecordRow.body).where(WorkRecordRow.job_id == job_id)
            if epoch is not None:
                steps = steps_of(epoch, spec.proof.epoch_steps, spec.steps)
                query = query.where(WorkRecordRow.step >= steps.start, WorkRecordRow.step < steps.stop)
            bodies = session.scalars(query.order_by(WorkRecordRow.step, WorkRecordRow.worker)).all()
        return [WorkRecord.model_validate(body) for body in bodies]

    def record_dues(self, job_id: str, finished: bool) -> dict[int, Dues]:
        """Per lease: the records its workers owed the job and the ones they filed ({} for a
        job that keeps none). A finished job committed all its steps; an ended one, those
        its host saw every member commit. Not the steps a record or a progress report
        names: a provider's word that the job got far would make every member owe records
        of steps never run, and the submitter's refund grow by their cut pay."""
        spec = self.specs.job_spec(job_id)
        if not spec.proof.enabled:
            return {}
        reached = self.host_reached(job_id)
        newest = -1 if reached is None else reached
        steps = range(spec.steps if finished else min(spec.steps, newest + 1))
        members = self.published.all_members(job_id)
        per_lease: dict[int, Dues] = {}
        for worker, dues in record_dues(self.work_records(job_id), members, steps).items():
            if (named := WorkerId.leased(worker)) is not None:
                per_lease[named.lease] = per_lease.get(named.lease, Dues()) + dues
        return per_lease

    def host_reached(self, job_id: str) -> int | None:
        """The newest step the job's host saw every member commit (None: no member has
        beaten yet, or the job has no host)."""
        return read_reached(self.hosts.run_dir(job_id))

    def reached_step(self, session: Session, job_id: str) -> int | None:
        """The newest step the job's records show it reached (None: no records): the
        second newest of the newest steps of the leases that stored a record within two
        agent timeouts (of every lease's, when none did), or the one such lease's. It
        holds an epoch missing records back until its members' records are in (they
        travel a beat behind the steps the host sees), and one lease that stopped
        storing records does not hold the job back past the window. Records name any
        step they like, so this is no bound on how far the job got: `host_reached` is."""
        newest = dict(session.execute(
            select(WorkRecordRow.lease, func.max(WorkRecordRow.step))
            .where(WorkRecordRow.job_id == job_id).group_by(WorkRecordRow.lease)).all())
        if not newest:
            return None
        recent = set(session.scalars(select(LeaseRow.lease).where(
            LeaseRow.job_id == job_id, LeaseRow.records_stored_at_s
            >= self.desk.now_s() - 2 * self.settings.agent_timeout_s))) & newest.keys()
        steps = sorted((newest[lease] for lease in recent or newest), reverse=True)
        return steps[1] if len(steps) > 1 else steps[0]

    # ------------------------------------------------------------ epochs (the round loop)
    def root_epochs(self, job_id: str | None = None) -> list[ProofEpochView]:
        """Root (and anchor) every epoch that is complete, or that the job has left behind."""
        rooted: list[ProofEpochView] = []
        with self.store.read() as session:
            query = select(JobRow.job_id).where(JobRow.status.in_(
                [JobStatus.running.value, JobStatus.paused.value, JobStatus.waiting.value]))
            jobs = [job_id] if job_id else session.scalars(query).all()
        for job in jobs:
            try:
                if not self.specs.job_spec(job).proof.enabled:
                    continue
            except (SpecError, tomllib.TOMLDecodeError, NotFound):
                continue
            with self.desk.change() as session:
                rooted += self._root_job_epochs(session, session.get(JobRow, job), final=False)
        return rooted

    def _root_job_epochs(self, session: Session, job: JobRow, final: bool) -> list[ProofEpochView]:
        spec = self.specs.job_spec(job.job_id, job.job_file)
        per_epoch = spec.proof.epoch_steps
        last = session.scalar(select(func.max(ProofEpochRow.epoch))
                              .where(ProofEpochRow.job_id == job.job_id))
        newest = self.reached_step(session, job.job_id)
        if final and newest is not None:  # the job is over: every epoch with records goes
            newest = session.scalar(select(func.max(WorkRecordRow.step))
                                    .where(WorkRecordRow.job_id == job.job_id))
        if newest is None:
            return []
        host = self.host_reached(job.job_id)
        # Left behind: past it by the host's word and its records' both (records lag the
        # host by a beat; colluding leases' records of steps far ahead run ahead of it).
        behind = -1 if host is None else min(newest, host)
        out = []
        epoch = 0 if last is None else last + 1
        while epoch <= epoch_of(newest, per_epoch):
            steps = steps_of(epoch, per_epoch, spec.steps)
            bodies = session.scalars(select(WorkRecordRow.body).where(
                WorkRecordRow.job_id == job.job_id, WorkRecordRow.step >= steps.start,
                WorkRecordRow.step < steps.stop)).all()
            records = [WorkRecord.model_validate(b) for b in bodies]
            complete = is_complete(records, epoch, per_epoch, spec.steps) and all_ranks(records)
            # While the job runs, its steps ran by the host's word, once it has one: leases
            # filing steps ahead under an old epoch that seated only them would otherwise
            # complete it before their peers of the next epoch could file.
            ran = final or host is None or host >= steps.stop - 1
            now = self.desk.now_s()
            left_behind = behind >= 0 and epoch_of(behind, per_epoch) >= epoch + ROOT_AFTER_EPOCHS and \
                self._waited_for_records(job.job_id, epoch, now)
            if not (complete and ran or left_behind or final) or not records:
                break
            self._behind_seen.pop((job.job_id, epoch), None)
            tree, ordered = epoch_tree(records)
            row = ProofEpochRow(job_id=job.job_id, epoch=epoch, root="0x" + tree.root.hex(),
                                records=len(ordered), complete=complete, rooted_at_s=now)
            session.add(row)
            self._anchor(session, job, row)
            record_event(session, now, COORDINATOR, ProofEpochRooted(
                epoch=epoch, root=row.root, records=row.records, complete=complete,
                chain_epoch=row.chain_epoch), job.job_id)
            if not complete:
                log.warning("job %s: proof epoch %d rooted with steps missing records (a lost "
                            "worker's unsent records): verifiers judge those shares from what "
                            "their workers declared (under DiLoCo, replaying the states they "
                            "kept)", job.job_id, epoch)
            out.append(epoch_view(row))
            epoch += 1
        return out

    def _waited_for_records(self, job_id: str, epoch: int, now: float) -> bool:
        """Whether an epoch the job left behind has waited `records_grace_s` since that
        was first seen, for the records of its members still on their way."""
        since = self._behind_seen.setdefault((job_id, epoch), now)
        return now - since >= self.settings.records_grace_s

    def _anchor(self, session: Session, job: JobRow, row: ProofEpochRow) -> None:
        if self.settlement is None or job.chain_job is None:
            return
        ledger = self.settlement.ledger
        value = anchored_value(session, job.job_id, row.epoch, row.root,
                               self.settings.forced_error_rate, self.desk.now_s())
        try:
            chain_epoch = ledger.job(job.chain_job).epochs
            outcome = ledger.anchor(self.settlement.operator, job.chain_job, chain_epoch, value)
        except LedgerError as error:  # the epoch stays rooted here; the chain is told nothing
            log.error("job %s: anchoring proof epoch %d failed: %s", job.job_id, row.epoch, error)
            return
        row.chain_epoch, row.anchored_at_s = chain_epoch, self.desk.now_s()
        row.anchor_tx, row.anchored_root = outcome.tx_hash, value

    def proof_epochs(self, job_id: str) -> list[ProofEpochView]:
        with self.store.read() as session:
            if session.get(JobRow, job_id) is None:
                raise NotFound(f"no job '{job_id}'")
            rows = session.scalars(select(ProofEpochRow).where(ProofEpochRow.job_id == job_id)
                                   .order_by(ProofEpochRow.epoch))
            return [epoch_view(row) for row in rows]

    # ------------------------------------------------------------ challenges (verifiers)
    def awaiting_records(self, job_id: str) -> bool:
        """A finished job waits a few beats for its last steps' records before it ends
        (they travel with each agent's next heartbeat), never longer: until every rank
        with a share of the last step filed its record, since pay follows the records
        (`record_dues`) and an agent a beat behind its peers must not lose its last steps."""
        try:
            spec = self.specs.job_spec(job_id)
        except (SpecError, tomllib.TOMLDecodeError, NotFound):
            return False
        if not spec.proof.enabled:
            return False
        now = self.desk.now_s()
        first = self._final_seen.setdefault(job_id, now)
        if now - first > RECORDS_GRACE_BEATS * self.settings.heartbeat_s + 1.0:
            return False
        with self.store.read() as session:
            last = [WorkRecord.model_validate(body) for body in session.scalars(
                select(WorkRecordRow.body).where(WorkRecordRow.job_id == job_id,
                                                 WorkRecordRow.step == spec.steps - 1))]
        return not last or not all_ranks(last)

    def close_proofs(self, session: Session, job: JobRow) -> None:
        """At a job's end: root (and anchor) what is left, before the bill is anchored."""
        try:
            if self.specs.job_spec(job.job_id, job.job_file).proof.enabled:
                self._root_job_epochs(session, job, final=True)
        except (SpecError, tomllib.TOMLDecodeError):
            return


def all_ranks(records: list[WorkRecord]) -> bool:
    """Every step has a record from each rank with samples in the step's split (a step
    covered by one worker's records is not complete while another's are on their way)."""
    by_step: dict[int, list[WorkRecord]] = defaultdict(list)
    for record in records:
        by_step[record.step].append(record)
    for step_records in by_step.values():
        step_records = final_lineage(step_records)
        shares = Counter(r.shares for r in step_records).most_common(1)[0][0]
        needed = {rank for rank, share in enumerate(shares) if share > 0}
        if not needed <= {r.rank for r in step_records}:
            return False
    return True


def _check_record(record: WorkRecord, spec: JobSpec, agent_id: str, lease: int,
                  rooted: int | None) -> None:
    if record.job != spec.name:
        raise Conflict(f"a record names job '{record.job}'; this job's records name '{spec.name}'")
    if not runs_on(record.worker, agent_id, lease):
        raise Forbidden(f"worker '{record.worker}' is not on this lease: its workers' ids "
                        f"are '{agent_id}-l{lease}-a<attempt>-w<index>'")
    if record.step >= spec.steps:
        raise Conflict(f"step {record.step} is past the job's last step ({spec.steps - 1})")
    if (record.local is not None) != (spec.sync.mode is SyncMode.diloco):
        # A DiLoCo record without its own step's claims would audit as `unavailable`
        # forever; an every-step one with them would send audits down the wrong path.
        raise Conflict(f"the record of step {record.step} {'claims' if record.local else 'lacks'} "
                       f"a DiLoCo step's start and end; this job's sync is "
                       f"'{spec.sync.mode.value}'")
    epoch = epoch_of(record.step, spec.proof.epoch_steps)
    if rooted is not None and epoch <= rooted:
        raise Conflict(f"step {record.step} is in proof epoch {epoch}, "
                       "already rooted: a record must be uploaded before its epoch is rooted")
