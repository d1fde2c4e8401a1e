"""Checkpoints carried between machines, a service the coordinator holds.

Only a job's rank 0 writes checkpoints, on its own machine. When the last
worker holding the job's live state is lost (its machine reclaimed or
killed while a replacement is still joining, or a paused job resumed
elsewhere), that disk is gone with it. So the agent of the worker that
writes them sends each new checkpoint here, and an agent whose worker joins
the job fetches the newest one into its own checkpoint folder: whoever
restores from disk then finds the job's state, not a fresh initialization.

What is served must not be a provider's word alone where the job keeps
work records: the checkpoint's parameters must hash to what every work
record of its step (the newest lineage) says that step started from. The
records come from the workers that trained the step, other providers
included, so a provider cannot feed the next one a forged state. Only the
lease of the worker that writes the job's checkpoints at that step may send
it (the first upload of a step stands), and what follows from the job and
the step alone (the data cursor, the optimizer's settings) must be what
they say: `checkpoint_checks`, which also names what stays on the sender's
word. A job without work records takes a checkpoint as a joiner takes live
state from a peer (the same trust), and its view says `verified: false`.

Files live under the coordinator's data folder, one job per folder, laid
out as the workers' own checkpoint store (`step-N.safetensors` and its manifest,
the manifest last), so a restart finds them as they were.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.services.checkpoint_checks import check_cursor, check_optimizer
from shoal.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.coordinator.db.schema import JobRow, LeaseRow, OfferRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.settings import CoordinatorSettings
from shoal.proof.epochs import epoch_of, final_lineage
from shoal.spec.checkpoint import CheckpointView
from shoal.spec.errors import SpecError
from shoal.spec.events import CheckpointCarried
from shoal.spec.job import JobSpec
from shoal.spec.proof import WorkRecord
from shoal.spec.worker import WorkerId
from shoal.train.files import (
    checkpoint_manifests,
    payload_name,
    prune_checkpoints,
    write_checkpoint,
)
from shoal.train.hashing import param_sha256

log = logging.getLogger(__name__)
KEEP = 2  # carried checkpoints kept per job: the newest, and one in case it is being read
# A lease that ended (a pause, a spot notice) may still send what its worker wrote as it
# left, for this long: the last worker of a paused job writes the job's state down then.
UPLOAD_GRACE_S = 120.0
# Models kept to hash uploads with, one per job (building one reads its corpus): a long-lived
# coordinator runs many jobs, and keeps only the most recently used.
MODELS_KEPT = 4

# What the proof services hand in: a job's spec (job, its job file if at hand), the work
# records of a job's epoch, and every published epoch's members in rank order.
SpecOf = Callable[[str, str | None], JobSpec]
RecordsOf = Callable[[str, int], list[WorkRecord]]
MembersOf = Callable[[str], dict[int, tuple[str, ...]]]


class NotYetVerifiable(Conflict):
    """The records of the checkpoint's step are not here yet: send it again later."""


class CheckpointCarry:
    """Each job's newest checkpoint, taken from its writer's agent once checked against
    the job's work records, and served to its providers and its submitter."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 job_spec: SpecOf, work_records: RecordsOf, published_members: MembersOf,
                 replayer: Callable[[JobSpec], Any] | None) -> None:
        """`job_spec`, `work_records`, `published_members`: the proof services';
        `replayer` builds a job's replayer, whose model hashes an upload's parameters
        (None: a job with work records cannot have its checkpoints carried)."""
        self.store, self.desk, self.settings = store, desk, settings
        self.job_spec, self.work_records = job_spec, work_records
        self.published_members, self.replayer = published_members, replayer
        # One upload checked and written at a time (they share the job's model to hash
        # parameters with); reads never wait on it. Uploads are one per checkpoint interval.
        self._lock = threading.Lock()
        self._models: dict[str, tuple[JobSpec, Any]] = {}

    def carried_dir(self, job_id: str) -> Path:
        """The job's folder of carried checkpoints, laid out as a worker's own."""
        return self.settings.data_dir / "checkpoints" / job_id

    def carried(self, job_id: str) -> CheckpointView | None:
        """The newest carried checkpoint of a job, or None."""
        with self.store.read() as session:
            if session.get(JobRow, job_id) is None:
                raise NotFound(f"no job '{job_id}'")
        return self._held(job_id)

    def _held(self, job_id: str) -> CheckpointView | None:
        manifests = checkpoint_manifests(self.carried_dir(job_id))
        return _view(job_id, manifests[0]) if manifests else None

    def upload_checkpoint(self, provider: str, job_id: str, lease_number: int, step: int,
                          data: bytes) -> CheckpointView:
        """Take a checkpoint a lease's worker wrote at `step`; refused unless it is whole,
        of this job, newer than the one held, sent by the lease of the step's checkpoint
        writer, at the step's data cursor, and (with work records) verified."""
        if not data:
            raise Conflict("a checkpoint is the file the worker wrote; the body is empty")
        with self.store.read() as session:
            job = session.get(JobRow, job_id)
            if job is None:
                raise NotFound(f"no job '{job_id}'")
            self.active_lease(session, provider, job_id, lease_number, UPLOAD_GRACE_S)
            spec = self.job_spec(job_id, job.job_file)
        held = self._held(job_id)
        if held is not None and held.step >= step:
            return held.model_copy(update={"stored": False})
        state = _load(data, step)
        check_cursor(spec, step, state)
        with self._lock:
            held = self._held(job_id)
            if held is not None and held.step >= step:  # another agent's upload won the race
                return held.model_copy(update={"stored": False})
            records = self._step_records(job_id, spec, step)
            self._check_writer(job_id, step, lease_number, records)
            verified = self._verify(job_id, spec, step, state, records)
            view = self._write(job_id, spec, step, data, lease_number, provider, verified)
        with self.desk.change() as session:
            record_event(session, view.at_s, provider, CheckpointCarried(
                step=step, lease=lease_number, bytes=view.bytes, sha256=view.sha256,
                verified=verified), job_id)
        log.info("job %s: checkpoint of step %d carried from lease %d (%d bytes%s)", job_id,
                 step, lease_number, view.bytes, ", verified" if verified else "")
        return view

    def checkpoint_file(self, reader: str, job_id: str) -> tuple[CheckpointView, Path]:
        """The newest carried checkpoint, for a provider with a live lease on the job or
        for the job's submitter: a job's model is theirs, not the public's."""
        with self.store.read() as session:
            job = session.get(JobRow, job_id)
            if job is None:
                raise NotFound(f"no job '{job_id}'")
            if reader.lower() != job.submitter.lower():
                self.active_lease(session, reader, job_id, None, 0.0)
        view = self._held(job_id)
        if view is None:
            raise NotFound(f"job '{job_id}' has no carried checkpoint yet")
        return view, self.carried_dir(job_id) / payload_name(view.step)

    # ------------------------------------------------------------ checks
    def active_lease(self, session: Session, provider: str, job_id: str,
                     number: int | None, grace_s: float) -> LeaseRow:
        """A lease of `provider` on the job that has not ended, or ended less than `grace_s`
        ago (`number`: that lease); else `Forbidden`. File admission asks it too, before an
        upload's body is read."""
        now = self.desk.now_s()
        query = select(LeaseRow).where(LeaseRow.job_id == job_id,
                                       LeaseRow.provider == provider)
        if number is not None:
            query = query.where(LeaseRow.lease == number)
        for lease in session.scalars(query):
            if lease.ends_at_s is None or lease.ends_at_s + grace_s > now:
                return lease
        which = f"lease {number}" if number is not None else "a lease"
        raise Forbidden(f"{provider} holds no running {which} on job '{job_id}': only the "
                        "job's own providers (and its submitter, to read) see its checkpoints")

    def _step_records(self, job_id: str, spec: JobSpec, step: int) -> list[WorkRecord]:
        """The newest lineage's records of steps `step - 1` and `step` ([] for a job that
        keeps none); refused until a record of `step` is here."""
        if not spec.proof.enabled:
            return []
        wanted = {s for s in (step - 1, step) if s >= 0}
        records = final_lineage(r for epoch in {epoch_of(s, spec.proof.epoch_steps) for s in wanted}
                                for r in self.work_records(job_id, epoch) if r.step in wanted)
        if not any(r.step == step for r in records):
            raise NotYetVerifiable(
                f"no work record of step {step} is here yet to check the checkpoint against; "
                "send it again once the step's records are uploaded")
        return records

    def _check_writer(self, job_id: str, step: int, number: int,
                      records: list[WorkRecord]) -> None:
        """Refuse a sender whose lease's worker is not the one that writes the job's
        checkpoint of `step`. The runtime has rank 0 write it as it commits the step
        before (or, as the last worker leaving, the sole member of the epoch that would run
        it): rank 0 of the membership epochs that the records of the two steps name.
        Without records, which epoch ran a step is nobody's record: rank 0 of any
        published epoch, a weaker bound. An agent names one of its leases per job (it
        keeps one checkpoint folder per job), so another lease of the same agent and
        provider stands for the writer's."""
        members = self.published_members(job_id)
        epochs = {r.membership_epoch for r in records} if records else set(members)
        writers = {members[e][0] for e in epochs if members.get(e)}
        with self.store.read() as session:
            sender = session.get(LeaseRow, number)
            agent = _agent_of(session, sender)
            for worker in writers:
                named = WorkerId.leased(worker)
                lease = session.get(LeaseRow, named.lease if named is not None else 0)
                if lease is not None and lease.job_id == job_id \
                        and (lease.provider, _agent_of(session, lease)) == (sender.provider, agent):
                    return
        raise Forbidden(f"lease {number} runs no worker that writes job '{job_id}''s checkpoint "
                        f"of step {step} (rank 0: {', '.join(sorted(writers)) or 'none yet'}); "
                        "only the writer's agent sends it")

    def _verify(self, job_id: str, spec: JobSpec, step: int, state: dict[str, Any],
                records: list[WorkRecord]) -> bool:
        records = [r for r in records if r.step == step]
        if not records:
            return False
        model = self._loaded_model(job_id, spec, state)
        digest = param_sha256(model)
        claimed = {r.params_sha256 for r in records}
        if claimed != {digest}:
            raise Conflict(f"the checkpoint's parameters (sha256 {digest[:12]}…) are not what "
                           f"the {len(records)} work record(s) of step {step} started from: "
                           "refused, it would restore a state nobody trained")
        check_optimizer(spec, state, model)
        return True

    def _loaded_model(self, job_id: str, spec: JobSpec, state: dict[str, Any]) -> Any:
        """The job's model (kept per job), holding the checkpoint's parameters."""
        if self.replayer is None:
            raise Conflict("this coordinator cannot build the job's model to check a "
                           "checkpoint against its work records (start it with a replayer)")
        cached = self._models.pop(job_id, None)
        if cached is None or cached[0] != spec:
            cached = (spec, self.replayer(spec).model)
        self._models[job_id] = cached  # the newest last: the oldest go first
        while len(self._models) > MODELS_KEPT:
            self._models.pop(next(iter(self._models)))
        model = cached[1]
        try:
            model.load_state_dict(state["model"])
        except (RuntimeError, KeyError, TypeError) as error:
            raise SpecError(f"the checkpoint's model does not fit the job's: {error}"[:400])
        return model

    # ------------------------------------------------------------ files
    def _write(self, job_id: str, spec: JobSpec, step: int, data: bytes, lease: int,
               provider: str, verified: bool) -> CheckpointView:
        folder = self.carried_dir(job_id)
        manifest = write_checkpoint(folder, step, data, spec.resume_identity(),
                                    self.desk.now_s(), lease=lease, provider=provider,
                                    verified=verified)
        prune_checkpoints(folder, KEEP)
        return _view(job_id, manifest)


def _load(data: bytes, step: int) -> dict[str, Any]:
    """The upload as a state file (shoal.train.state_file: safetensors, nothing in it
    inflates, nothing runs); a torch archive or anything else is refused unread."""
    from shoal.train.state_file import StateFileError, decode

    try:
        state = decode(data, len(data))
    except StateFileError as error:
        raise SpecError(f"the body is not a checkpoint a worker wrote: {error}"[:400]) from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise SpecError("the body is not a checkpoint a worker wrote (no model state)")
    if state.get("step") != step:
        raise SpecError(f"the checkpoint is of step {state.get('step')!r}, not {step} as sent")
    if not isinstance(state.get("cursor"), int):
        raise SpecError("the checkpoint has no data cursor: it cannot resume the data order")
    return state


def _agent_of(session: Session, lease: LeaseRow) -> str | None:
    offer = session.get(OfferRow, lease.offer_id)
    return offer.agent_id if offer is not None else None


def _view(job_id: str, manifest_path: Path) -> CheckpointView:
    m = json.loads(manifest_path.read_text())
    return CheckpointView(job_id=job_id, step=m["step"], sha256=m["sha256"], bytes=m["bytes"],
                          lease=m["lease"], provider=m["provider"], at_s=m["written_at"],
                          verified=m["verified"])

