"""Share moves held to the host's own clock (issue 40, point 6: speeds at the host).

Each member reports its own speed (shoal.train.shares), and shares follow the
reports. A member that inflates its report takes a share it cannot compute in
time, and every step waits for it; one that deflates it idles on a small share
while its lease is paid by the second. The host cannot see a member compute:
the exchange is between the members, and one step's time is a single figure,
the slowest member's. When shares follow the reports, every member looks
exactly as fast as it claims by anything measured within one step. What the
host can see is what a move of the shares did to the step time: so a move is
a trial. The median step time over the interval after it is held against the
median over the interval before; a move that made steps slower (beyond
`TOLERANCE`) is undone at the next rebalance point, and the next 2**k
proposals are passed over after the k-th undone one. One move grows no
member's share by more than `GROWTH`: a claim of any size makes steps at most
that much slower for one interval, each time it is tried, ever more rarely.

A member whose share a move grew, when the move is undone, is refuted: the
speed the job publishes for it (which its offer is held to) is then the one
its share stood at, on the scale its peers' reports set, not its own word.

What a report can still do: deflate this member's own share (a slower device
looks the same to every clock; its offer is marked down to the speed it
showed: shoal.coordinator.services.speed_marks), or move the shares within
`TOLERANCE` per accepted move. docs/threat-model.md says so.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field

# A move stands if the steps after it are at most this much slower than before (a move
# that changes nothing measures within noise of the time before it, either way).
TOLERANCE = 0.02
# The most one move multiplies a member's share by: a true speed-up is reached in a few
# moves (2x in two), a false claim costs one interval of steps at most this much slower.
GROWTH = 1.5
MIN_INTERVALS = 3  # step times needed on each side to judge (fewer: no move, no verdict)
WINDOW = 32  # the newest step times kept on each side


@dataclass
class _Trial:
    before: float  # median step time under the weights the move replaced
    weights: tuple[float, ...]  # those weights, to go back to
    grown: frozenset[str]  # the members whose share the move grew


@dataclass
class EpochSteps:
    """One epoch's committed steps as the deciding host timed them, since its shares
    last moved, and the move on trial if any."""

    times: list[float] = field(default_factory=list)  # seconds per step, newest last
    trial: _Trial | None = None
    _last: tuple[float, int] | None = None  # (host time, step) of the last committed decision

    def committed(self, t: float, step: int, weights_moved: bool) -> None:
        """A committed decision on `step` at host time `t`; `weights_moved`: it carries
        new weights (the steps after it run under them)."""
        if self._last is not None and step > self._last[1]:
            self.times.append((t - self._last[0]) / (step - self._last[1]))
            del self.times[:-WINDOW]
        self._last = (t, step)
        if weights_moved:
            self.times.clear()

    def median(self) -> float | None:
        return statistics.median(self.times) if len(self.times) >= MIN_INTERVALS else None


@dataclass
class ShareMoves:
    """The job's share moves, across epochs: which proposals become decisions."""

    undone: int = 0  # moves undone so far in the job
    # Members whose grown share was undone (and not grown by a move that stood since);
    # replaced whole, never changed in place: the job host reads it from another thread.
    refuted: frozenset[str] = frozenset()
    _skip: int = 0  # proposals still to pass over

    def due(self, steps: EpochSteps, members: tuple[str, ...], current: tuple[float, ...],
            proposed: tuple[float, ...] | None) -> tuple[float, ...] | None:
        """The weights a rebalance point's decision carries: the proposal (the members'
        reported speeds, if they moved), the weights a failed move replaced, or None."""
        after = steps.median()
        trial = steps.trial
        if trial is not None:
            if after is None:
                return None  # too few steps since the move to judge it: judged next time
            steps.trial = None
            if after > trial.before * (1 + TOLERANCE):
                self.undone += 1
                self._skip = 2 ** self.undone
                self.refuted = self.refuted | trial.grown
                return trial.weights
            self.refuted = self.refuted - trial.grown
        if proposed is None or proposed == current:
            return None
        if self._skip > 0:
            self._skip -= 1
            return None
        if after is None:
            return None  # no time measured under the current weights: nothing to hold it to
        moved = bounded(current, proposed)
        grown = frozenset(m for m, o, n in zip(members, _shares(current), _shares(moved))
                          if n > o)
        steps.trial = _Trial(before=after, weights=current, grown=grown)
        return moved

    def published(self, weights: dict[str, float], reported: dict[str, float]) -> dict[str, float]:
        """The speeds the job publishes for its members (`weights`: each one's standing
        share weight; `reported`: their own word): a refuted member's is its weight on
        the scale of the others' reports (their median speed per unit of weight); the
        others' their own. A refuted member with no unrefuted peer to scale by is left out."""
        refuted = self.refuted
        scales = [reported[m] / weights[m] for m in reported
                  if m not in refuted and weights.get(m)]
        scale = statistics.median(scales) if scales else None
        out = {}
        for member, speed in reported.items():
            if member not in refuted:
                out[member] = speed
            elif scale is not None and weights.get(member):
                out[member] = min(speed, weights[member] * scale)
        return out


class MemberWeights:
    """Each member's share weight as the last step it took part in left it. A new epoch
    keeps it (shares move only at rebalance points, each move on trial); a newcomer
    starts at the mean. Written by the decider's threads, read by the authority and the
    job host."""

    def __init__(self) -> None:
        self._carried: dict[str, float] = {}
        self._lock = threading.Lock()

    def decided(self, members: tuple[str, ...], weights: tuple[float, ...]) -> None:
        with self._lock:
            self._carried.update(zip(members, weights))

    def of(self, members: tuple[str, ...]) -> dict[str, float]:
        with self._lock:
            return {m: self._carried[m] for m in members if m in self._carried}

    def for_epoch(self, members: tuple[str, ...]) -> tuple[float, ...]:
        carried = self.of(members)
        default = sum(carried.values()) / len(carried) if carried else 1.0
        return tuple(carried.get(m, default) for m in members)


def _shares(weights: tuple[float, ...]) -> list[float]:
    total = sum(weights)
    return [w / total for w in weights]


def bounded(current: tuple[float, ...], proposed: tuple[float, ...]) -> tuple[float, ...]:
    """`proposed`, or the step towards it that grows no member's share by more than
    GROWTH (the same direction, in the proposal's units)."""
    new_total = sum(proposed)
    old, new = _shares(current), _shares(proposed)
    step = min([1.0] + [(GROWTH - 1) * o / (n - o) for o, n in zip(old, new) if n > GROWTH * o])
    if step >= 1.0:
        return proposed
    return tuple(new_total * (o + step * (n - o)) for o, n in zip(old, new))
