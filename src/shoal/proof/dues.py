"""The records each worker owed the job and the ones it filed, so that pay can
follow them: a contribution without a record cannot be audited, and a worker
that withholds its records (or replaces one with a claim the final lineage
does not take) would otherwise be paid for work nobody can check.

A committed step is owed one record by every member of the membership epoch
it committed in (its final lineage) that the step's split gave samples. A
step with no record from anyone says neither its epoch nor its split; it is
owed by every member of the lineage of the nearest step that has records
(membership rarely changes between neighbouring steps), so that withholding
together does not wipe out what is owed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shoal.proof.epochs import final_lineage
from shoal.spec.proof import WorkRecord


@dataclass(frozen=True)
class Dues:
    """One worker's records: how many steps owed one, and how many it filed."""

    owed: int = 0
    filed: int = 0

    @property
    def missing(self) -> int:
        return self.owed - self.filed

    def __add__(self, other: Dues) -> Dues:
        return Dues(self.owed + other.owed, self.filed + other.filed)

    def pay_share(self, amount: int) -> int:
        """`amount` cut to the share of owed records filed (all of it when nothing was owed)."""
        return amount if self.owed == 0 else amount * self.filed // self.owed


def record_dues(records: Iterable[WorkRecord], members: Mapping[int, Sequence[str]],
                steps: range) -> dict[str, Dues]:
    """Each worker's dues over `steps` (the steps the job committed).

    `members`: the published membership epochs, each its members in rank order. A step
    whose lineage names an epoch not in `members` is skipped (nobody can say who owed)."""
    final = defaultdict(list)
    for record in final_lineage(records):
        final[record.step].append(record)
    recorded = sorted(final)
    owed: Counter[str] = Counter()
    filed: Counter[str] = Counter()
    for step in steps:
        step_records = final.get(step)
        if step_records:
            epoch = step_records[0].membership_epoch
            shares = Counter(r.shares for r in step_records).most_common(1)[0][0]
            seats = members.get(epoch)
            if seats is None or len(seats) != len(shares):
                continue
            owing = [seats[rank] for rank, share in enumerate(shares) if share > 0]
        else:
            nearest = _nearest(recorded, step)
            if nearest is not None:
                owing = list(members.get(final[nearest][0].membership_epoch, ()))
            else:  # nothing at all was filed: the newest published membership owes it
                owing = list(members[max(members)]) if members else []
        present = {r.worker for r in step_records or ()}
        for worker in owing:
            owed[worker] += 1
            filed[worker] += worker in present
    return {worker: Dues(owed[worker], filed[worker]) for worker in sorted(owed)}


def _nearest(recorded: Sequence[int], step: int) -> int | None:
    """The recorded step closest to `step`, the earlier on a tie (it is already past)."""
    i = bisect_left(recorded, step)
    around = recorded[max(0, i - 1):i + 1]
    return min(around, key=lambda s: (abs(s - step), s > step)) if around else None
