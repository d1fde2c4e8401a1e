"""The membership epochs a job's host has published (its `epochs.jsonl`), read
incrementally for everyone that asks (the membership timeline, the planner,
the hold of leases to membership), and the check that holds a work record's
claimed epoch, rank and world to them: left to
the worker's word, an inflated epoch would make its record the only "final
lineage" of its step (`shoal.proof.epochs.final_lineage`), so that the step's
honest records were neither audited nor counted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shoal import jsonl
from shoal.coordinator.errors import Conflict
from shoal.spec.progress import MembershipChange
from shoal.spec.proof import WorkRecord


@dataclass
class _JobEpochs:
    members: dict[int, tuple[str, ...]] = field(default_factory=dict)  # epoch -> members by rank
    sources: dict[int, str] = field(default_factory=dict)  # a resync's epoch -> its state source
    changes: list[MembershipChange] = field(default_factory=list)  # every line, in order
    offset: int = 0  # bytes of the file read so far (whole lines only)


class PublishedEpochs:
    """Each job's published epochs, read incrementally: only what the host appended since
    the last read (for a record's check, only when it names an epoch not read yet)."""

    def __init__(self, run_dir: Callable[[str], Path]) -> None:
        self._run_dir = run_dir
        self._jobs: dict[str, _JobEpochs] = {}
        self._lock = threading.Lock()  # API threads and the round loop read alike

    def changes(self, job_id: str) -> list[MembershipChange]:
        """Every epoch the job's host published, in order."""
        with self._lock:
            job = self._jobs.setdefault(job_id, _JobEpochs())
            self._read_new_lines(self._run_dir(job_id) / "epochs.jsonl", job)
            return list(job.changes)

    def all_members(self, job_id: str) -> dict[int, tuple[str, ...]]:
        """Every published epoch's members in rank order, by epoch number."""
        with self._lock:
            job = self._jobs.setdefault(job_id, _JobEpochs())
            self._read_new_lines(self._run_dir(job_id) / "epochs.jsonl", job)
            return dict(job.members)

    def members(self, job_id: str, epoch: int) -> tuple[str, ...] | None:
        """The members of `epoch` in rank order, or None if the host never published it."""
        with self._lock:
            job = self._jobs.setdefault(job_id, _JobEpochs())
            if epoch not in job.members:  # published since the last read, perhaps: read again
                self._read_new_lines(self._run_dir(job_id) / "epochs.jsonl", job)
            return job.members.get(epoch)

    def state_source(self, job_id: str, epoch: int) -> str | None:
        """The member whose state every other member of `epoch` adopted (a resync), or None."""
        self.members(job_id, epoch)  # read what was published since
        with self._lock:
            job = self._jobs.setdefault(job_id, _JobEpochs())
            return job.sources.get(epoch)

    def check(self, job_id: str, record: WorkRecord) -> None:
        """Refuse a record whose epoch, rank or world is not what the job's host published."""
        epoch = record.membership_epoch
        members = self.members(job_id, epoch)
        what = f"the record of {record.worker} for step {record.step}"
        if members is None:
            raise Conflict(f"{what} names membership_epoch {epoch}, which the job's host never "
                           "published; a record names the epoch its step committed in")
        if record.worker not in members:
            raise Conflict(f"{what}: worker {record.worker} is not a member of membership epoch "
                           f"{epoch} (its members: {', '.join(members)})")
        if record.rank != members.index(record.worker):
            raise Conflict(f"{what} claims rank {record.rank}; in membership epoch {epoch} it is "
                           f"rank {members.index(record.worker)}")
        if len(record.shares) != len(members):
            raise Conflict(f"{what} splits the step {len(record.shares)} ways (shares); membership "
                           f"epoch {epoch} has {len(members)} members")

    def _read_new_lines(self, path: Path, job: _JobEpochs) -> None:
        try:
            if path.stat().st_size < job.offset:  # replaced by a shorter file: start over
                job.members.clear()
                job.sources.clear()
                job.changes.clear()
                job.offset = 0
        except FileNotFoundError:
            return
        lines, job.offset = jsonl.read(path, job.offset)  # a line still being written waits
        for line in lines:
            try:
                value = json.loads(line)
                epoch, members, t = int(value["epoch"]), value["members"], float(value["t"])
            except (ValueError, KeyError, TypeError):
                continue  # not an epoch line (the host writes nothing else)
            if not isinstance(members, list):
                continue
            members = tuple(map(str, members))
            # One host per job, numbering each epoch once: the first line of a number stands.
            source = value.get("state_source")
            source = source if isinstance(source, str) else None
            if epoch not in job.members and source is not None:
                job.sources[epoch] = source
            job.members.setdefault(epoch, members)
            job.changes.append(MembershipChange(t=t, epoch=epoch, members=members,
                                                reason=str(value.get("reason", "")),
                                                state_source=source))
