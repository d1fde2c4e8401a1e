"""The agent's side of proof of learning: its workers' work records go to the
coordinator as they are written, and the files verifiers challenge (a
revealed contribution, the parameters a step started from) are sent from
the job's proof directory when asked.

Records are read from where the worker appended them, from the last byte
sent; after an agent restart everything is sent again and the coordinator
counts the repeats as known. Only whole lines are sent: a record the worker
is still writing waits for the next beat.

The agent, not its workers, drops the challenge files (its workers run with
`--keep-proof-files`): an epoch's go once the coordinator's reply to a beat
whose challenges were all answered is `PRUNE_MARGIN_S` past the epoch's window
(coordinator/windows.py). Both times are the coordinator's, so no clock skew
between machines matters; and every challenge the coordinator took before the
window closed was in that reply, so an honest worker never lacks a file it
was asked for. A job's files stay while the coordinator cannot be asked.
"""

from __future__ import annotations

import logging
import time
import tomllib
from pathlib import Path

from pydantic import ValidationError

from shoal.agent.tail import Tail
from shoal.client.http import CoordinatorClient, CoordinatorRefused
from shoal.errors import ControlError
from shoal.proof.epochs import kept_from
from shoal.proof.layout import ProofLayout, step_of
from shoal.spec import JobSpec, SpecError, parse_job
from shoal.spec.audit import MAX_RECORDS_PER_UPLOAD, BlobKind, ChallengeView, RecordUpload
from shoal.spec.proof import WorkRecord
from shoal.spec.worker import WorkerId
from shoal.verify.proof_store import ProofStore

log = logging.getLogger(__name__)
# How far past an epoch's window a beat must be before its files go: a challenge taken
# just before the window closed is in the pending list of every beat this much later.
PRUNE_MARGIN_S = 10.0
PRUNE_EVERY_S = 15.0  # how often the agent asks the coordinator which windows closed


def proof_dir(work_dir: Path, job_id: str) -> Path:
    """Where the agent's workers of `job_id` keep records and challenge files."""
    return work_dir / "jobs" / job_id / "proof"


class ProofRelay:
    def __init__(self, client: CoordinatorClient, work_dir: Path, agent_id: str,
                 answer_client: CoordinatorClient | None = None) -> None:
        """`answer_client`: the connection answers and pruning use (`client` by default):
        the agent answers on a thread of its own, so that no upload holds an answer up."""
        self.client, self.work_dir, self.agent_id = client, work_dir, agent_id
        self.answer_client = answer_client or client
        self._tail = Tail()
        self._answered: set[int] = set()
        self._specs: dict[str, JobSpec] = {}  # job -> its job file, as the coordinator has it
        self._kept_from: dict[str, int] = {}  # job -> the first step whose files are kept
        self._pruned_at = float("-inf")  # monotonic
        self._unknown: set[str] = set()  # jobs whose windows the coordinator did not tell
        self.prune_margin_s, self.prune_every_s = PRUNE_MARGIN_S, PRUNE_EVERY_S

    def upload(self, jobs: set[str]) -> int:
        """Send the new records of this agent's workers in `jobs`; the number sent."""
        sent = 0
        for job_id in sorted(jobs):
            folder = ProofLayout(proof_dir(self.work_dir, job_id)).records_dir
            for path in sorted(folder.glob(f"{self.agent_id}-l*.jsonl")):
                sent += self._upload_file(job_id, path)
        return sent

    def _upload_file(self, job_id: str, path: Path) -> int:
        worker = WorkerId.leased(path.stem)  # the file is named by its worker
        if worker is None or worker.agent != self.agent_id:
            return 0
        records = []
        lines, end = self._tail.new_lines(path)
        for line in lines:
            try:
                records.append(WorkRecord.model_validate_json(line))
            except ValidationError as error:
                log.error("%s: a malformed record line is skipped: %s", path, error)
        lease = worker.lease
        for i in range(0, len(records), MAX_RECORDS_PER_UPLOAD):
            batch = tuple(records[i : i + MAX_RECORDS_PER_UPLOAD])
            try:
                self.client.upload_records(job_id, RecordUpload(lease=lease, records=batch))
            except CoordinatorRefused as refused:
                if len(batch) == 1:
                    _refused(job_id, lease, batch[0], refused)
                else:  # a batch is stored whole or not at all: the others must not go with it
                    self._upload_one_by_one(job_id, lease, batch)
        self._tail.consumed(path, end)  # not reached when the coordinator is unreachable
        return len(records)

    def _upload_one_by_one(self, job_id: str, lease: int, batch: tuple[WorkRecord, ...]) -> None:
        for record in batch:
            try:
                self.client.upload_records(job_id, RecordUpload(lease=lease, records=(record,)))
            except CoordinatorRefused as refused:
                _refused(job_id, lease, record, refused)

    def answer(self, challenges: tuple[ChallengeView, ...]) -> bool:
        """Send the files `challenges` ask for; whether every one is settled (sent, refused
        for good, or not here), so that files may be pruned up to the beat that asked."""
        settled = True
        for challenge in challenges:
            if challenge.challenge in self._answered:
                continue
            path = ProofLayout(proof_dir(self.work_dir, challenge.job_id)).kept(
                challenge.kind, challenge.worker, challenge.step)
            if not path.exists():
                log.warning("challenge %d: %s is not here (past the challenge window?)",
                            challenge.challenge, path)
                self._answered.add(challenge.challenge)  # asking again will not make it appear
                continue
            try:
                self.answer_client.answer_challenge(challenge.challenge, path.read_bytes())
            except CoordinatorRefused as refused:
                log.warning("challenge %d: answer refused: %s", challenge.challenge, refused.detail)
            except ControlError as error:
                log.warning("challenge %d: not sent (%s); trying at the next beat",
                            challenge.challenge, error)
                settled = False
                continue
            self._answered.add(challenge.challenge)
            log.info("challenge %d answered (%s of %s, step %d)", challenge.challenge,
                     challenge.kind.value, challenge.worker, challenge.step)
        return settled

    def prune(self, answered_through_s: float, now: bool = False) -> dict[str, int]:
        """Drop the challenge files of every epoch whose window closed `prune_margin_s`
        before `answered_through_s` (the coordinator's time of a beat whose challenges
        are all answered), in each job this agent holds files of; at most once every
        `prune_every_s` unless `now`. Returns job -> the first step still kept."""
        if not now and time.monotonic() - self._pruned_at < self.prune_every_s:
            return {}
        self._pruned_at = time.monotonic()
        out = {}
        for folder in sorted((self.work_dir / "jobs").glob("*/proof")):
            job_id = folder.parent.name
            if not _holds_files(folder):
                continue
            try:
                keep_from = self._closed_before(job_id, answered_through_s)
            except (ControlError, SpecError, tomllib.TOMLDecodeError) as error:
                if job_id not in self._unknown:  # said once: it is asked again every pass
                    log.warning("job %s: cannot tell which challenge windows closed (%s); "
                                "its files stay", job_id, error)
                self._unknown.add(job_id)
                continue
            self._unknown.discard(job_id)
            if keep_from <= self._kept_from.get(job_id, 0):
                continue
            store = ProofStore(folder)
            workers = {p.name for kind in (BlobKind.reveal, BlobKind.local)
                       if (kinds := ProofLayout(folder).kept_dir(kind)).is_dir()
                       for p in kinds.iterdir() if p.is_dir()}
            for worker in sorted(workers) or [""]:  # "": the step parameters only
                store.prune(worker, keep_from)
            self._kept_from[job_id] = out[job_id] = keep_from
            log.info("job %s: challenge files of steps before %d dropped (their epochs' "
                     "windows closed)", job_id, keep_from)
        return out

    def _closed_before(self, job_id: str, answered_through_s: float) -> int:
        """The first step whose files an audit may still ask for: its window (that of its
        epoch, or under DiLoCo its round's end's) is not closed by the margin."""
        if job_id not in self._specs:
            self._specs[job_id] = parse_job(tomllib.loads(self.answer_client.job_file(job_id)),
                                            "job_file")
        spec = self._specs[job_id]
        closed = 0
        for view in sorted(self.answer_client.proof_epochs(job_id), key=lambda v: v.epoch):
            if view.epoch != closed or view.challenges_close_at_s is None or \
                    view.challenges_close_at_s + self.prune_margin_s > answered_through_s:
                break
            closed += 1
        # Under DiLoCo a round's end's audit reads its whole round's files: a step's go
        # with the window of the epoch its round ends in (as the coordinator judges it).
        return kept_from(closed, spec.proof.epoch_steps, spec.sync.inner_steps - 1, spec.steps)


def _holds_files(folder: Path) -> bool:
    layout = ProofLayout(folder)
    return any(step_of(path) is not None for kind in BlobKind
               for path in layout.kept_dir(kind).rglob("*") if path.is_file())


def _refused(job_id: str, lease: int, record: WorkRecord, refused: CoordinatorRefused) -> None:
    # A record the coordinator will never take (its epoch was rooted while we were away,
    # or it claims a seat the job's host never gave): say so once and move on, or we would
    # resend it forever.
    log.error("job %s lease %d: the record of %s for step %d is refused: %s", job_id, lease,
              record.worker, record.step, refused.detail)
