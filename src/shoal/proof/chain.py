"""The chain from one step to the next: along a job's final lineage, each step
starts where the step before it ended as applied (`WorkRecord.end_sha256`), and
a step the guard rolled back ends at the state its snapshot's step started from.

Audits replay each step from its own start, so without this a state injected
between steps (a resync's or a joiner's state source sending other parameters)
passes every audit: every later record starts from it and all agree. The state
moves between steps only when an epoch forms, so a break falls on the state
source the job's host published for an epoch formed across it.
"""

from __future__ import annotations

import collections
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from shoal.spec.proof import WorkRecord

# A membership epoch -> the member whose state the others adopted there (a resync's
# state source, as the job's host published it), or None.
StateSources = Callable[[int], str | None]
Claim = TypeVar("Claim", bound=Hashable)


@dataclass(frozen=True)
class ChainBreak:
    """A step whose start (or, rolled back, whose end) is not where the lineage was."""

    step: int
    expected: str  # the state the lineage holds there: the step before's end, or the snapshot's
    found: str  # what most of the step's records claim instead
    membership_epoch: int  # the epoch the step committed in
    source: str | None  # the state source the fault falls on (None: no epoch published one)
    detail: str

    def blames(self, worker: str, step: int) -> bool:
        return self.source == worker and self.step == step


def majority_claim(claims: Sequence[Claim]) -> Claim | None:
    """The value more of a step's records claim than any other, or None (no claims, a
    tie, or most claim none): one claim against another decides nothing."""
    ranked = collections.Counter(claims).most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


def chain_breaks(lineage: Iterable[WorkRecord], sources: StateSources,
                 steps: range | None = None) -> list[ChainBreak]:
    """Every break in the chain of `lineage` (a job's final lineage: one membership epoch's
    records per step), at the steps in `steps` (all by default). A pair of steps is judged
    only where both sides have a strict majority claim: a step of two that disagrees, old
    records with no end, or DiLoCo's inner steps (each replica its own) decide nothing."""
    by_step: dict[int, list[WorkRecord]] = defaultdict(list)
    for record in lineage:
        by_step[record.step].append(record)
    breaks = []
    for step in sorted(by_step):
        if steps is not None and step not in steps:
            continue
        found = _rollback_break(by_step, step, sources) or _start_break(by_step, step, sources)
        if found is not None:
            breaks.append(found)
    return breaks


def _start_break(by_step: dict[int, list[WorkRecord]], step: int,
                 sources: StateSources) -> ChainBreak | None:
    before, records = by_step.get(step - 1), by_step[step]
    if before is None:
        return None
    expected, found = _agreed_end(before), _agreed_start(records)
    if expected is None or found is None or expected == found:
        return None
    epoch, previous = records[0].membership_epoch, before[0].membership_epoch
    source = _source_between(previous + 1, epoch, sources)
    return ChainBreak(step, expected, found, epoch, source,
                      f"step {step} starts from {found[:12]}, but step {step - 1} ended at "
                      f"{expected[:12]}: {_blame(source, previous, epoch)}")


def _rollback_break(by_step: dict[int, list[WorkRecord]], step: int,
                    sources: StateSources) -> ChainBreak | None:
    """A step most of whose records say the guard rolled back to the state step N started
    from must end there (a snapshot travels with live state, so a forged one would be
    the injection, taken at the rollback)."""
    records = by_step[step]
    to = majority_claim([r.rolled_back_to for r in records])
    snapshot = by_step.get(to) if isinstance(to, int) else None
    if snapshot is None or to >= step:
        return None
    expected, found = _agreed_start(snapshot), _agreed_end(records)
    if expected is None or found is None or expected == found:
        return None
    epoch = records[0].membership_epoch
    source = _source_between(snapshot[0].membership_epoch, epoch, sources)
    return ChainBreak(step, expected, found, epoch, source,
                      f"step {step} rolled back to the state step {to} started from "
                      f"({expected[:12]}), but ended at {found[:12]}: the snapshot was not the "
                      f"job's; {_blame(source, snapshot[0].membership_epoch, epoch)}")


def _agreed_start(records: list[WorkRecord]) -> str | None:
    """Where most of a step's records say it started, if they all start alike: every
    step of an every-step job; under DiLoCo, a round's first step (theta_outer)."""
    if 2 * sum(r.local is None or r.local.round_start == r.step for r in records) <= len(records):
        return None  # a DiLoCo inner step: each worker from its own replica
    return majority_claim([r.params_sha256 for r in records])


def _agreed_end(records: list[WorkRecord]) -> str | None:
    """Where most of a step's records say it ended as applied (None for records from
    before ends were committed, and where replicas differ: DiLoCo's inner steps)."""
    return majority_claim([r.end_sha256 for r in records])


def _source_between(first: int, last: int, sources: StateSources) -> str | None:
    """The state source of the newest epoch in [first, last] that published one."""
    for epoch in range(last, first - 1, -1):
        source = sources(epoch)
        if source is not None:
            return source
    return None


def _blame(source: str | None, first: int, last: int) -> str:
    if source is not None:
        return f"the state came from {source}, the state source its host published"
    return (f"no epoch from {first} to {last} published a state source (a join's or a "
            "restore's transfer, or records that lie together)")
