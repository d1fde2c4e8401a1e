"""Proof of learning through the coordinator, mixed into `Coordinator`.

Agents upload their workers' work records; the coordinator roots each
proof epoch once (a Merkle root over its records, in (step, worker) order)
and anchors it on the job's chain escrow; verifiers raise challenges for
the files only a worker's agent holds (a revealed contribution, or the
parameters a step started from), which the agent answers at its next beat;
verifiers file signed verdicts, and the referee (referee.py) rules on the
guilty ones.

Records are commitments: one stored for (job, worker, step) is never
replaced, a record arriving after its epoch was rooted is refused, and a
challenge is answered once. A worker may only speak for itself: its id
must carry the prefix its agent gives workers of that lease
(`AGENT-lLEASE-`), and the agent must be the caller's.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import tomllib
from collections import Counter, defaultdict
from pathlib import Path
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shoal.control.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.control.store.schema import (
    AgentRow, ChallengeRow, JobRow, LeaseRow, OfferRow, ProofEpochRow, VerdictRow, WorkRecordRow,
)
from shoal.ledger import LedgerError
from shoal.proof.epochs import final_lineage, is_complete, params_keepers, steps_of
from shoal.proof.merkle import epoch_tree
from shoal.spec.audit import (
    BlobKind, ChallengeRequest, ChallengeView, ProofEpochView, RecordUpload, UploadReceipt,
    VerdictFiling, VerdictView,
)
from shoal.spec.coordinator import COORDINATOR, JobStatus
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec
from shoal.spec.jobfile import parse_job
from shoal.spec.proof import Verdict, WorkRecord

log = logging.getLogger(__name__)
# An epoch whose records are still incomplete is rooted anyway once the job's
# records reach this many epochs beyond it: a worker lost with its agent never
# uploads the steps it had not sent, and the job must not wait for it forever.
ROOT_AFTER_EPOCHS = 2
RECORDS_GRACE_BEATS = 5  # how long a finished job waits for its last records, in heartbeats


def worker_prefix(agent_id: str, lease: int) -> str:
    """What every worker id of `lease` on `agent_id` starts with (see control.agent.leases)."""
    return f"{agent_id}-l{lease}-"


class ProofService:
    """Uses the Coordinator's `engine`, `settings`, `settlement`, `_change`, `_event`, `now_s`."""

    def _proof_init(self) -> None:
        self._challenge_lock = threading.Lock()
        self._pending: dict[str, dict[int, ChallengeView]] = defaultdict(dict)  # agent -> open
        self._specs: dict[str, JobSpec] = {}
        self._final_seen: dict[str, float] = {}  # job -> when its host's final word was first read
        with Session(self.engine) as session:
            for row in session.scalars(select(ChallengeRow).where(ChallengeRow.answered_at_s.is_(None))):
                self._pending[row.agent_id][row.challenge] = _challenge_view(row)

    def proof_dir(self, job_id: str) -> Path:
        """The job's answered challenges, laid out as a `ProofStore` (params/, reveal/)."""
        return self.settings.data_dir / "proof" / job_id

    def job_file(self, job_id: str) -> str:
        with Session(self.engine) as session:
            row = session.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"no job '{job_id}'")
            return row.job_file

    def job_spec(self, job_id: str, job_file: str | None = None) -> JobSpec:
        if job_id not in self._specs:
            job_file = job_file if job_file is not None else self.job_file(job_id)
            self._specs[job_id] = parse_job(tomllib.loads(job_file), source="job_file")
        return self._specs[job_id]

    # ------------------------------------------------------------ records (agents)
    def upload_records(self, provider: str, job_id: str, upload: RecordUpload) -> UploadReceipt:
        with self._change() as session:
            now = self.now_s()
            job = self._proof_job(session, job_id)
            spec = self.job_spec(job_id, job.job_file)
            lease = session.get(LeaseRow, upload.lease)
            if lease is None or lease.job_id != job_id:
                raise NotFound(f"job '{job_id}' has no lease {upload.lease}")
            if lease.provider != provider:
                raise Forbidden(f"lease {upload.lease} is not yours")
            agent_id = session.get(OfferRow, lease.offer_id).agent_id
            prefix = worker_prefix(agent_id, lease.lease)
            rooted = session.scalar(select(func.max(ProofEpochRow.epoch))
                                    .where(ProofEpochRow.job_id == job_id))
            stored = known = 0
            for record in upload.records:
                _check_record(record, spec, prefix, rooted)
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
                self._event(session, now, provider, "work_records_stored", job_id,
                            lease=lease.lease, records=stored, steps=[min(steps), max(steps)])
            return UploadReceipt(stored=stored, known=known)

    def _proof_job(self, session: Session, job_id: str) -> JobRow:
        job = session.get(JobRow, job_id)
        if job is None:
            raise NotFound(f"no job '{job_id}'")
        if not self.job_spec(job_id, job.job_file).proof.enabled:
            raise Conflict(f"job '{job_id}' keeps no work records ([proof] enabled = false)")
        return job

    def work_records(self, job_id: str, epoch: int | None = None) -> list[WorkRecord]:
        spec = self.job_spec(job_id)
        with Session(self.engine) as session:
            query = select(WorkRecordRow.body).where(WorkRecordRow.job_id == job_id)
            if epoch is not None:
                steps = steps_of(epoch, spec.proof.epoch_steps, spec.steps)
                query = query.where(WorkRecordRow.step >= steps.start, WorkRecordRow.step < steps.stop)
            bodies = session.scalars(query.order_by(WorkRecordRow.step, WorkRecordRow.worker)).all()
        return [WorkRecord.model_validate(body) for body in bodies]

    # ------------------------------------------------------------ epochs (the round loop)
    def root_epochs(self, job_id: str | None = None) -> list[ProofEpochView]:
        """Root (and anchor) every epoch that is complete, or that the job has left behind."""
        rooted: list[ProofEpochView] = []
        with Session(self.engine) as session:
            query = select(JobRow.job_id).where(JobRow.status.in_(
                [JobStatus.running.value, JobStatus.paused.value, JobStatus.waiting.value]))
            jobs = [job_id] if job_id else session.scalars(query).all()
        for job in jobs:
            try:
                if not self.job_spec(job).proof.enabled:
                    continue
            except (SpecError, tomllib.TOMLDecodeError, NotFound):
                continue
            with self._change() as session:
                rooted += self._root_job_epochs(session, session.get(JobRow, job), final=False)
        return rooted

    def _root_job_epochs(self, session: Session, job: JobRow, final: bool) -> list[ProofEpochView]:
        spec = self.job_spec(job.job_id, job.job_file)
        per_epoch = spec.proof.epoch_steps
        last = session.scalar(select(func.max(ProofEpochRow.epoch))
                              .where(ProofEpochRow.job_id == job.job_id))
        newest = session.scalar(select(func.max(WorkRecordRow.step))
                                .where(WorkRecordRow.job_id == job.job_id))
        if newest is None:
            return []
        out = []
        epoch = 0 if last is None else last + 1
        while epoch <= newest // per_epoch:
            steps = steps_of(epoch, per_epoch, spec.steps)
            bodies = session.scalars(select(WorkRecordRow.body).where(
                WorkRecordRow.job_id == job.job_id, WorkRecordRow.step >= steps.start,
                WorkRecordRow.step < steps.stop)).all()
            records = [WorkRecord.model_validate(b) for b in bodies]
            complete = is_complete(records, epoch, per_epoch, spec.steps) and all_ranks(records)
            left_behind = newest // per_epoch >= epoch + ROOT_AFTER_EPOCHS
            if not (complete or left_behind or final) or not records:
                break
            tree, ordered = epoch_tree(records)
            now = self.now_s()
            row = ProofEpochRow(job_id=job.job_id, epoch=epoch, root="0x" + tree.root.hex(),
                                records=len(ordered), complete=complete, rooted_at_s=now)
            session.add(row)
            self._anchor(session, job, row)
            self._event(session, now, COORDINATOR, "proof_epoch_rooted", job.job_id, epoch=epoch,
                        root=row.root, records=row.records, complete=complete,
                        chain_epoch=row.chain_epoch)
            if not complete:
                log.warning("job %s: proof epoch %d rooted with steps missing records (a lost "
                            "worker's unsent records); they cannot be audited", job.job_id, epoch)
            out.append(_epoch_view(row))
            epoch += 1
        return out

    def _anchor(self, session: Session, job: JobRow, row: ProofEpochRow) -> None:
        if self.settlement is None or job.chain_job is None:
            return
        ledger = self.settlement.ledger
        try:
            chain_epoch = ledger.job(job.chain_job).epochs
            outcome = ledger.anchor(self.settlement.operator, job.chain_job, chain_epoch, row.root)
        except LedgerError as error:  # the epoch stays rooted here; the chain is told nothing
            log.error("job %s: anchoring proof epoch %d failed: %s", job.job_id, row.epoch, error)
            return
        row.chain_epoch, row.anchored_at_s = chain_epoch, self.now_s()
        row.anchor_tx = outcome.tx_hash

    def proof_epochs(self, job_id: str) -> list[ProofEpochView]:
        with Session(self.engine) as session:
            if session.get(JobRow, job_id) is None:
                raise NotFound(f"no job '{job_id}'")
            rows = session.scalars(select(ProofEpochRow).where(ProofEpochRow.job_id == job_id)
                                   .order_by(ProofEpochRow.epoch))
            return [_epoch_view(row) for row in rows]

    # ------------------------------------------------------------ challenges (verifiers)
    def raise_challenges(self, verifier: str, job_id: str,
                         items: tuple[ChallengeRequest, ...]) -> list[ChallengeView]:
        out = []
        with self._change() as session:
            now = self.now_s()
            self._proof_job(session, job_id)
            for item in items:
                row = session.scalar(select(ChallengeRow).where(
                    ChallengeRow.job_id == job_id, ChallengeRow.worker == item.worker,
                    ChallengeRow.step == item.step, ChallengeRow.kind == item.kind.value))
                if row is None and item.kind is BlobKind.params:
                    # Parameters are the step's, whoever asks: file them under one keeper.
                    agent_id, worker = self._holder(session, job_id, item)
                    item = item.model_copy(update={"worker": worker})
                    row = session.scalar(select(ChallengeRow).where(
                        ChallengeRow.job_id == job_id, ChallengeRow.worker == worker,
                        ChallengeRow.step == item.step, ChallengeRow.kind == item.kind.value))
                if row is None:
                    agent_id, worker = self._holder(session, job_id, item)
                    row = ChallengeRow(job_id=job_id, worker=worker, step=item.step,
                                       kind=item.kind.value, requested_by=verifier,
                                       requested_at_s=now, agent_id=agent_id)
                    session.add(row)
                    session.flush()
                    self._event(session, now, verifier, "challenge_raised", job_id,
                                challenge=row.challenge, worker=item.worker, step=item.step,
                                blob=item.kind.value, agent_id=row.agent_id)
                out.append(_challenge_view(row))
        with self._challenge_lock:
            for view in out:
                if view.answered_at_s is None:
                    self._pending[view.agent_id][view.challenge] = view
        return out

    def _holder(self, session: Session, job_id: str, item: ChallengeRequest) -> tuple[str, str]:
        """The agent that holds the file: the worker's, or for parameters, the agent of one
        of the step's two keepers (`params_keepers`), an online one if there is."""
        rows = session.scalars(select(WorkRecordRow).where(
            WorkRecordRow.job_id == job_id, WorkRecordRow.step == item.step)).all()
        # The newest lineage's records: after a restore, a step's parameters are those the
        # redone step started from.
        newest = max((r.body.get("membership_epoch", 0) for r in rows), default=0)
        if item.kind is BlobKind.reveal:
            found = [r for r in rows if r.worker == item.worker]
        else:
            found = [r for r in rows if r.body.get("membership_epoch", 0) == newest
                     and r.body.get("rank") in params_keepers(item.step,
                                                              len(r.body.get("shares", ())))]
            seen = dict(session.execute(select(AgentRow.agent_id, AgentRow.last_seen_s).where(
                AgentRow.agent_id.in_({r.agent_id for r in found}))).all())
            found.sort(key=lambda r: (-seen.get(r.agent_id, 0.0), r.body.get("rank")))
        if not found:
            raise NotFound(f"no work record of {item.worker} at step {item.step} in job "
                           f"'{job_id}' to challenge" if item.kind is BlobKind.reveal else
                           f"no record of a worker keeping step {item.step}'s parameters in "
                           f"job '{job_id}'")
        return found[0].agent_id, found[0].worker

    def pending_challenges(self, agent_id: str) -> tuple[ChallengeView, ...]:
        """What the agent must answer (the heartbeat's reply: memory only, no store read)."""
        with self._challenge_lock:
            return tuple(self._pending.get(agent_id, {}).values())

    def challenges(self, job_id: str) -> list[ChallengeView]:
        """The job's challenges; an unanswered one says whether its agent is offline (silent
        past the agent timeout), so a verifier need not wait for an answer that cannot come."""
        horizon = self.now_s() - self.settings.agent_timeout_s
        with Session(self.engine) as session:
            rows = session.scalars(select(ChallengeRow).where(ChallengeRow.job_id == job_id)
                                   .order_by(ChallengeRow.challenge)).all()
            seen = dict(session.execute(select(AgentRow.agent_id, AgentRow.last_seen_s).where(
                AgentRow.agent_id.in_({row.agent_id for row in rows}))).all())
            return [_challenge_view(row).model_copy(update={
                        "holder_offline": row.answered_at_s is None
                        and seen.get(row.agent_id, 0.0) < horizon})
                    for row in rows]

    def answer_challenge(self, provider: str, challenge: int, data: bytes) -> ChallengeView:
        if not data:
            raise Conflict("an answer is the file the worker wrote; the body is empty")
        with self._change() as session:
            now = self.now_s()
            row = session.get(ChallengeRow, challenge)
            if row is None:
                raise NotFound(f"no challenge {challenge}")
            agent = session.get(AgentRow, row.agent_id)
            if agent is None or agent.provider != provider:
                raise Forbidden(f"challenge {challenge} is for agent '{row.agent_id}', not yours")
            if row.answered_at_s is not None:
                raise Conflict(f"challenge {challenge} was answered already; an answer is final")
            path = self._blob_path(row)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".part")
            partial.write_bytes(data)
            os.replace(partial, path)
            row.answered_at_s, row.sha256 = now, hashlib.sha256(data).hexdigest()
            self._event(session, now, provider, "challenge_answered", row.job_id,
                        challenge=challenge, bytes=len(data), sha256=row.sha256)
            view = _challenge_view(row)
        with self._challenge_lock:
            self._pending[view.agent_id].pop(challenge, None)
        return view

    def _blob_path(self, row: ChallengeRow) -> Path:
        base = self.proof_dir(row.job_id)
        if row.kind == BlobKind.params.value:
            return base / "params" / f"{row.step:09d}.pt"
        return base / "reveal" / row.worker / f"{row.step:09d}.pt"

    def challenge_file(self, challenge: int) -> Path:
        with Session(self.engine) as session:
            row = session.get(ChallengeRow, challenge)
            if row is None:
                raise NotFound(f"no challenge {challenge}")
            if row.answered_at_s is None:
                raise NotFound(f"challenge {challenge} is not answered yet; its agent sends the "
                               "file at its next heartbeat")
            return self._blob_path(row)

    # ------------------------------------------------------------ verdicts
    def file_verdicts(self, verifier: str, job_id: str, filing: VerdictFiling) -> list[VerdictView]:
        from shoal.control.trust.verdicts import SignedVerdict

        out, guilty = [], []
        with self._change() as session:
            now = self.now_s()
            job = self._proof_job(session, job_id)
            name = self.job_spec(job_id, job.job_file).name
            for body in filing.verdicts:
                signed = SignedVerdict(verdict=body.verdict, signature=body.signature)
                if signed.verdict.verifier.lower() != verifier.lower() or not signed.authentic:
                    raise Forbidden("each verdict must be signed by the key that files it "
                                    f"({verifier}); sign them with `shoal verify --key`")
                if signed.verdict.job != name:
                    raise Conflict(f"a verdict names job '{signed.verdict.job}', not '{name}'")
                row = VerdictRow(job_id=job_id, at_s=now, verifier=verifier,
                                 worker=signed.verdict.worker, step=signed.verdict.step,
                                 kind=signed.verdict.kind.value, body=body.model_dump(mode="json"))
                session.add(row)
                session.flush()
                out.append(_verdict_view(row))
                if signed.verdict.guilty:
                    guilty.append(row.seq)
            kinds: dict[str, int] = defaultdict(int)
            for view in out:
                kinds[view.verdict.kind.value] += 1
            self._event(session, now, verifier, "verdicts_filed", job_id, kinds=dict(kinds),
                        guilty=[(v.verdict.worker, v.verdict.step, v.verdict.kind.value)
                                for v in out if v.verdict.guilty])
        if guilty and self.referee is not None:
            self.referee.rule_later(job_id, guilty)
        return out

    def verdicts(self, job_id: str) -> list[VerdictView]:
        with Session(self.engine) as session:
            rows = session.scalars(select(VerdictRow).where(VerdictRow.job_id == job_id)
                                   .order_by(VerdictRow.seq))
            return [_verdict_view(row) for row in rows]

    def awaiting_records(self, job_id: str) -> bool:
        """A finished job waits a few beats for its last steps' records before it ends
        (they travel with each agent's next heartbeat), never longer."""
        try:
            spec = self.job_spec(job_id)
        except (SpecError, tomllib.TOMLDecodeError, NotFound):
            return False
        if not spec.proof.enabled:
            return False
        now = self.now_s()
        first = self._final_seen.setdefault(job_id, now)
        if now - first > RECORDS_GRACE_BEATS * self.settings.heartbeat_s + 1.0:
            return False
        with Session(self.engine) as session:
            newest = session.scalar(select(func.max(WorkRecordRow.step))
                                    .where(WorkRecordRow.job_id == job_id))
        return newest is None or newest < spec.steps - 1

    def drop_provider(self, job_id: str, provider: str, reason: str) -> None:
        """A provider caught cheating: its offers that hold this job's leases are withdrawn,
        so its workers stop and the next round leases replacements."""
        with Session(self.engine) as session:
            offers = set(session.scalars(select(LeaseRow.offer_id).where(
                LeaseRow.job_id == job_id, LeaseRow.provider == provider)))
        for offer_id in sorted(offers):
            self.withdraw_offer(COORDINATOR, offer_id, reason=reason)

    def close_proofs(self, session: Session, job: JobRow) -> None:
        """At a job's end: root (and anchor) what is left, before the bill is anchored."""
        try:
            if self.job_spec(job.job_id, job.job_file).proof.enabled:
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


def _check_record(record: WorkRecord, spec: JobSpec, prefix: str, rooted: int | None) -> None:
    if record.job != spec.name:
        raise Conflict(f"a record names job '{record.job}'; this job's records name '{spec.name}'")
    if not record.worker.startswith(prefix):
        raise Forbidden(f"worker '{record.worker}' is not on this lease: its workers' ids "
                        f"start with '{prefix}'")
    if record.step >= spec.steps:
        raise Conflict(f"step {record.step} is past the job's last step ({spec.steps - 1})")
    if rooted is not None and record.step // spec.proof.epoch_steps <= rooted:
        raise Conflict(f"step {record.step} is in proof epoch {record.step // spec.proof.epoch_steps}, "
                       "already rooted: a record must be uploaded before its epoch is rooted")


def _epoch_view(row: ProofEpochRow) -> ProofEpochView:
    return ProofEpochView(epoch=row.epoch, root=row.root, records=row.records,
                          complete=row.complete, chain_epoch=row.chain_epoch,
                          anchored_at_s=row.anchored_at_s, anchor_tx=row.anchor_tx)


def _challenge_view(row: ChallengeRow) -> ChallengeView:
    return ChallengeView(challenge=row.challenge, job_id=row.job_id, worker=row.worker,
                         step=row.step, kind=BlobKind(row.kind), agent_id=row.agent_id,
                         requested_at_s=row.requested_at_s, answered_at_s=row.answered_at_s,
                         sha256=row.sha256)


def _verdict_view(row: VerdictRow) -> VerdictView:
    return VerdictView(seq=row.seq, at_s=row.at_s, verdict=Verdict.model_validate(row.body["verdict"]),
                       ruling=row.ruling)

