"""The agent's side of proof of learning: its workers' work records go to the
coordinator as they are written, and the files verifiers challenge (a
revealed contribution, the parameters a step started from) are sent from
the job's proof directory when asked.

Records are read from where the worker appended them, from the last byte
sent; after an agent restart everything is sent again and the coordinator
counts the repeats as known. Only whole lines are sent: a record the worker
is still writing waits for the next beat.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from pydantic import ValidationError

from shoal.control.agent.tail import Tail
from shoal.control.client import CoordinatorClient, CoordinatorRefused
from shoal.control.errors import ControlError
from shoal.spec.audit import MAX_RECORDS_PER_UPLOAD, BlobKind, ChallengeView, RecordUpload
from shoal.spec.proof import WorkRecord

log = logging.getLogger(__name__)


def proof_dir(work_dir: Path, job_id: str) -> Path:
    """Where the agent's workers of `job_id` keep records and challenge files."""
    return work_dir / "jobs" / job_id / "proof"


class ProofRelay:
    def __init__(self, client: CoordinatorClient, work_dir: Path, agent_id: str) -> None:
        self.client, self.work_dir, self.agent_id = client, work_dir, agent_id
        self._tail = Tail()
        self._answered: set[int] = set()
        self._lease = re.compile(re.escape(agent_id) + r"-l([0-9]+)-")

    def upload(self, jobs: set[str]) -> int:
        """Send the new records of this agent's workers in `jobs`; the number sent."""
        sent = 0
        for job_id in sorted(jobs):
            folder = proof_dir(self.work_dir, job_id) / "records"
            for path in sorted(folder.glob(f"{self.agent_id}-l*.jsonl")):
                sent += self._upload_file(job_id, path)
        return sent

    def _upload_file(self, job_id: str, path: Path) -> int:
        match = self._lease.match(path.name)
        if match is None:
            return 0
        records = []
        lines, end = self._tail.new_lines(path)
        for line in lines:
            try:
                records.append(WorkRecord.model_validate_json(line))
            except ValidationError as error:
                log.error("%s: a malformed record line is skipped: %s", path, error)
        lease = int(match.group(1))
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

    def answer(self, challenges: tuple[ChallengeView, ...]) -> None:
        for challenge in challenges:
            if challenge.challenge in self._answered:
                continue
            store = proof_dir(self.work_dir, challenge.job_id)
            if challenge.kind is BlobKind.params:
                path = store / "params" / f"{challenge.step:09d}.pt"
            else:  # reveal/ or local/ (under DiLoCo): the worker's own file of the step
                path = store / challenge.kind.value / challenge.worker / f"{challenge.step:09d}.pt"
            if not path.exists():
                log.warning("challenge %d: %s is not here (past the challenge window?)",
                            challenge.challenge, path)
                self._answered.add(challenge.challenge)  # asking again will not make it appear
                continue
            try:
                self.client.answer_challenge(challenge.challenge, path.read_bytes())
            except CoordinatorRefused as refused:
                log.warning("challenge %d: answer refused: %s", challenge.challenge, refused.detail)
            except ControlError as error:
                log.warning("challenge %d: not sent (%s); trying at the next beat",
                            challenge.challenge, error)
                continue
            self._answered.add(challenge.challenge)
            log.info("challenge %d answered (%s of %s, step %d)", challenge.challenge,
                     challenge.kind.value, challenge.worker, challenge.step)


def _refused(job_id: str, lease: int, record: WorkRecord, refused: CoordinatorRefused) -> None:
    # A record the coordinator will never take (its epoch was rooted while we were away,
    # or it claims a seat the job's host never gave): say so once and move on, or we would
    # resend it forever.
    log.error("job %s lease %d: the record of %s for step %d is refused: %s", job_id, lease,
              record.worker, record.step, refused.detail)
