"""The agent's report of how its jobs are doing: the steps its workers
committed while rank 0 (every member logs the same global loss; one report
per step is enough), read from their step logs and sent at each beat."""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError

from shoal.agent.tail import Tail
from shoal.client.http import CoordinatorClient, CoordinatorRefused
from shoal.spec.elastic import StepRecord
from shoal.spec.progress import MAX_STEPS_PER_UPLOAD, ProgressUpload, StepProgress

log = logging.getLogger(__name__)


class ProgressRelay:
    def __init__(self, client: CoordinatorClient, work_dir: Path) -> None:
        self.client, self.work_dir = client, work_dir
        self._tail = Tail()

    def upload(self, leases: dict[int, str]) -> int:
        """Send new rank-0 steps of each lease's workers (`leases`: number -> job)."""
        sent = 0
        for number, job_id in sorted(leases.items()):
            lease_dir = self.work_dir / f"lease-{number}"
            # A bundled job's launcher runs in the lease's sandbox directory, job/.
            for path in sorted([*lease_dir.glob("run-*/steps-*.jsonl"),
                                *lease_dir.glob("job/run-*/steps-*.jsonl")]):
                sent += self._upload_file(number, job_id, path)
        return sent

    def _upload_file(self, lease: int, job_id: str, path: Path) -> int:
        steps, worker = [], None
        lines, end = self._tail.new_lines(path)
        for line in lines:
            try:
                record = StepRecord.model_validate_json(line)
            except ValidationError:
                continue
            if record.rank == 0:
                worker = record.worker
                steps.append(StepProgress(step=record.step, t=record.t_commit, loss=record.loss,
                                          world=record.world, samples=sum(record.shares)))
        for i in range(0, len(steps), MAX_STEPS_PER_UPLOAD):
            try:
                self.client.upload_progress(job_id, ProgressUpload(
                    lease=lease, worker=worker, steps=tuple(steps[i : i + MAX_STEPS_PER_UPLOAD])))
            except CoordinatorRefused as refused:
                log.warning("lease %d: progress refused: %s", lease, refused.detail)
        self._tail.consumed(path, end)  # not reached when the coordinator is unreachable
        return len(steps)
