"""Each worker's log of committed steps (JSON lines), for the launcher's report:
data coverage, replica agreement and recovery times are all read from it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal import jsonl
from shoal.spec.elastic import StepRecord

if TYPE_CHECKING:
    from shoal.train.attempt import Attempt
    from shoal.train.member import Membership
    from shoal.train.sync.protocol import Sync


class StepLog:
    def __init__(self, run_dir: Path | None, worker: str) -> None:
        self._handle: Any = None
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            # Line-buffered: a SIGKILL loses at most the line being written.
            self._handle = open(run_dir / f"steps-{worker}.jsonl", "a", buffering=1)

    def write(self, step: int, cursor: int, membership: Membership, attempt: Attempt,
              sync: Sync, loss: float | None, applied: bool, t_commit: float,
              fingerprint: str | None) -> None:
        """The committed step `step`, which started at sample position `cursor`."""
        if self._handle is None:
            return
        record = StepRecord(
            step=step, epoch=membership.record.epoch, worker=membership.worker,
            rank=membership.rank, world=membership.world, cursor=cursor,
            shares=attempt.shares, t_start=attempt.started, t_commit=t_commit,
            loss=loss, applied=applied,
            param_sha256=fingerprint, bytes_sent=sync.bytes_sent,
            samples_dropped=sync.samples_dropped,
            slt_seen=sync.slt_seen, rounds_late=sync.rounds_late,
            rounds_dropped=sync.rounds_dropped,
        )
        self._handle.write(record.model_dump_json() + "\n")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def read_step_logs(run_dir: Path) -> list[StepRecord]:
    records = []
    for path in sorted(run_dir.glob("steps-*.jsonl")):
        for line in jsonl.read(path)[0]:
            if line.strip():
                try:
                    records.append(StepRecord.model_validate_json(line))
                except ValueError:
                    continue  # a line cut short by SIGKILL
    return records


