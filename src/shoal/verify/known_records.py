"""A job's work records as a DiLoCo audit reads them: every one, and by step, by worker
and by the states they start from or end at.

Each DiLoCo audit reads the records of the whole job (a step's start may be any
earlier round's end, a peer's restart may start where this worker's step claims
to end), and it did so with a pass over all of them for each question: ~5 ms an
audit at 1,200 records. The index is built once for a set of records and kept
while the same records are read again (`KnownRecords.of`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from shoal.spec.proof import WorkRecord


class KnownRecords:
    def __init__(self, records: list[WorkRecord]) -> None:
        self.all = list(records)
        self._ids = tuple(map(id, self.all))  # the records are kept: their ids stay theirs
        self._by_step: dict[int, list[WorkRecord]] = collections.defaultdict(list)
        self._by_worker: dict[str, list[WorkRecord]] = collections.defaultdict(list)
        self._ending_at: dict[str, list[WorkRecord]] = collections.defaultdict(list)
        # How many DiLoCo records start from a state: (parameters' SHA-256, or the
        # optimizer state's).
        self._params_from: collections.Counter = collections.Counter()
        self._state_from: collections.Counter = collections.Counter()
        for r in self.all:
            self._by_step[r.step].append(r)
            self._by_worker[r.worker].append(r)
            if r.local is not None:
                self._ending_at[r.local.end_state_sha256].append(r)
                self._params_from[r.params_sha256] += 1
                self._state_from[r.local.state_sha256] += 1

    @classmethod
    def of(cls, records: list[WorkRecord], known: KnownRecords | None) -> KnownRecords:
        """`known` if it indexes these very records (the same objects, in order), else a
        new index."""
        if known is not None and known._ids == tuple(map(id, records)):
            return known
        return cls(records)

    def __iter__(self) -> Iterator[WorkRecord]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def of_step(self, step: int) -> list[WorkRecord]:
        return list(self._by_step.get(step, ()))

    def of_worker(self, worker: str) -> list[WorkRecord]:
        return list(self._by_worker.get(worker, ()))

    def ending_at(self, state_sha256: str) -> list[WorkRecord]:
        """The DiLoCo records whose step claims to end at this optimizer state."""
        return list(self._ending_at.get(state_sha256, ()))

    def starting_from(self, params_sha256: str | None = None,
                      state_sha256: str | None = None) -> tuple[int, int]:
        """How many DiLoCo records start from these parameters, and from this state."""
        return (self._params_from[params_sha256] if params_sha256 is not None else 0,
                self._state_from[state_sha256] if state_sha256 is not None else 0)
