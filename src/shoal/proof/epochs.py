"""Proof epochs: the runs of `epoch_steps` steps whose records share one Merkle root.

An epoch is anchored, sampled and audited as a unit, so the runtime and the
verifier must agree exactly on which steps belong to which epoch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from shoal.proof.errors import ProofError
from shoal.spec.proof import WorkRecord


def _check_epoch_steps(epoch_steps: int) -> None:
    if epoch_steps < 1:
        raise ProofError(f"epoch_steps is {epoch_steps}; an epoch has at least one step")


def epoch_of(step: int, epoch_steps: int) -> int:
    """The epoch that step `step` (0-based) is in."""
    _check_epoch_steps(epoch_steps)
    if step < 0:
        raise ProofError(f"step {step} is negative; steps count from 0")
    return step // epoch_steps


def steps_of(epoch: int, epoch_steps: int, total_steps: int | None = None) -> range:
    """The steps of `epoch`; the job's last epoch ends at its last step (`total_steps`)."""
    _check_epoch_steps(epoch_steps)
    start = epoch * epoch_steps
    end = start + epoch_steps
    if total_steps is not None:
        end = min(end, total_steps)
    return range(start, max(start, end))


def window_epoch(step: int, epoch_steps: int, reach: int, total_steps: int) -> int:
    """The epoch whose challenge window governs step `step`'s files: that of the last
    step whose audit may read them. `reach`: how many steps on that is (under DiLoCo a
    round's end reads its whole round's files: inner_steps - 1; else 0)."""
    _check_epoch_steps(epoch_steps)
    return min(step + reach, max(total_steps - 1, step)) // epoch_steps


def kept_from(closed_epochs: int, epoch_steps: int, reach: int, total_steps: int) -> int:
    """Once epochs 0 .. closed_epochs - 1 have closed windows: the first step whose files
    an audit may still ask for (`window_epoch` of every earlier step is closed)."""
    _check_epoch_steps(epoch_steps)
    end = closed_epochs * epoch_steps
    return total_steps if end >= total_steps else max(0, end - reach)


def by_epoch(records: Iterable[WorkRecord], epoch_steps: int) -> dict[int, list[WorkRecord]]:
    """The records grouped by epoch, each group in (step, worker) order."""
    groups: dict[int, list[WorkRecord]] = defaultdict(list)
    for record in records:
        groups[epoch_of(record.step, epoch_steps)].append(record)
    return {e: sorted(g, key=lambda r: (r.step, r.worker)) for e, g in sorted(groups.items())}


PARAMS_KEEPERS = 2  # workers that keep the parameters each step starts from


def params_keepers(step: int, world: int) -> frozenset[int]:
    """The ranks that keep the parameters `step` starts from, for replays: two, rotating
    with the step, so one worker leaving (or lost) takes no step's parameters with it and
    each keeps about 2/world of the steps (rank 0 alone kept all, and took all with it)."""
    if world < 1:
        raise ProofError(f"world is {world}; a step has at least one worker")
    return frozenset((step + i) % world for i in range(min(PARAMS_KEEPERS, world)))


def final_lineage(records: Iterable[WorkRecord]) -> list[WorkRecord]:
    """Of each step's records, those of the lineage that went on: the newest membership
    epoch that credibly committed the step (a step redone after a restore leaves the
    abandoned lineage's records behind: honest work on a model that did not go on,
    neither audited nor blamed).

    A lineage is only what its records say, and a worker may file a record naming any
    published epoch it is a member of, for any step; so a newer lineage replaces an
    older one only if it is `credible`. One member claiming an old step for a later
    epoch, to shield the step's real records from audit, is not. With no credible
    lineage, the one more workers filed records for stands, ties to the older.
    """
    records = list(records)
    lineages: dict[int, dict[int, list[WorkRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        lineages[r.step][r.membership_epoch].append(r)
    chosen: dict[int, int] = {}
    for step, per_epoch in lineages.items():
        credible = [epoch for epoch, rs in per_epoch.items() if credible_lineage(rs)]
        chosen[step] = max(credible) if credible else max(
            per_epoch, key=lambda e: (len({r.worker for r in per_epoch[e]}), -e))
    return [r for r in records if r.membership_epoch == chosen[r.step]]


def credible_lineage(records: Sequence[WorkRecord]) -> bool:
    """Whether one step's records of one membership epoch show a commit of the epoch:
    they agree on the step's shares; every rank has a share whenever the batch has a
    sample per rank (the runtime's split gives each member at least one then); and more
    than half of the ranks with a share filed their record (a commit is every member's,
    and each member files one: a few may be lost with a machine, not most)."""
    shares = records[0].shares
    if any(r.shares != shares for r in records):
        return False
    if sum(shares) >= len(shares) and min(shares) == 0:
        return False
    with_share = {rank for rank, share in enumerate(shares) if share > 0}
    filed = {r.rank for r in records} & with_share
    return 2 * len(filed) > len(with_share)


def missing_steps(records: Iterable[WorkRecord], epoch: int, epoch_steps: int,
                  total_steps: int | None = None) -> list[int]:
    """The steps of `epoch` that no record covers (records of other epochs are ignored)."""
    seen = {r.step for r in records}
    return [s for s in steps_of(epoch, epoch_steps, total_steps) if s not in seen]


def is_complete(records: Iterable[WorkRecord], epoch: int, epoch_steps: int,
                total_steps: int | None = None) -> bool:
    """Whether every step of `epoch` has records, so its root may be anchored."""
    steps = steps_of(epoch, epoch_steps, total_steps)
    return len(steps) > 0 and not missing_steps(records, epoch, epoch_steps, total_steps)
