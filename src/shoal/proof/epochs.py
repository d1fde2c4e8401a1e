"""Proof epochs: the runs of `epoch_steps` steps whose records share one Merkle root.

An epoch is anchored, sampled and audited as a unit, so the runtime and the
verifier must agree exactly on which steps belong to which epoch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

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
    """Of each step's records, those of the newest membership epoch that committed it
    (a step redone after a restore leaves the abandoned lineage's records behind: they
    were honest work on a model that did not go on, and are neither audited nor blamed)."""
    records = list(records)
    newest: dict[int, int] = {}
    for r in records:
        newest[r.step] = max(newest.get(r.step, 0), r.membership_epoch)
    return [r for r in records if r.membership_epoch == newest[r.step]]


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
