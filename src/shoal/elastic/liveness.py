"""Liveness by progress: the authority fences a member that falls behind.

Every member reports the progress points it reaches in an epoch (arrived,
entered a step's exchange, voted: shoal.train.liveness), and refreshes its
point while it waits on peers. Two rules, one deadline:

- behind: the member that got furthest is the lead; a member short of the
  lead's point that has made no progress of its own for the deadline since
  the lead got there is fenced, whether its process is stopped, hung in its
  data loader or far slower than the rest. Progress of its own counts
  because DiLoCo's inner steps are not voted on: members drift apart within
  a round, and the lead waits at the outer step while the others still take
  their last inner steps, or, at the start, still receive the live state
  over a slow link (while forming an epoch, a refreshed point is progress);
- silent: a member whose report has not changed for the deadline while a
  member at the same point or further refreshed its own within it is
  fenced: everyone may be waiting in the same exchange, but the one that
  cannot reach the store (partitioned, frozen) is the one they wait for.

A member's point is its own word, so the authority counts it only as far as it
can check it (issue 40, point 6): points are compared as (epoch, voted steps
passed, at the exchange or not), the voted steps capped at the votes the
authority has decided in that epoch, and a vote cast is no further than the
exchange before it. A member that beats "far ahead" of its peers (a count of a
thousand, a vote not yet decided) therefore leads nobody: before, its peers,
waiting in an exchange it withheld its part from, were fenced as behind it.

The deadline follows the job:
a multiple of the median step time plus a margin, never below a floor,
nor below `rtt_multiple` round trips of the slowest member's path to the
store (a report across a WAN, queued behind a bulk exchange and lost to a
drop-tail queue, waits for TCP's retransmission timers; on a LAN this is
milliseconds and the floor decides);
reaching an epoch's barrier gets twice that, since members finish the
step in flight before they switch epochs.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from shoal.errors import ControlError
from shoal.spec.elastic import Phase, ProgressBeat


@dataclass(frozen=True)
class LivenessConfig:
    floor_s: float = 1.0  # never fence a member sooner than this
    step_multiple: float = 3.0  # deadline: this many median step times ...
    margin_s: float = 0.25  # ... plus this
    initial_s: float = 10.0  # deadline until a few step times are measured
    history: int = 20  # step times in the median
    rtt_multiple: float = 30.0  # ... and never below this many round trips to the store

    def __post_init__(self) -> None:
        if self.floor_s <= 0 or self.initial_s <= 0 or self.step_multiple < 1 or self.margin_s < 0:
            raise ControlError("liveness: floor_s and initial_s must be positive, "
                               "step_multiple at least 1, margin_s not negative")


# (epoch, voted steps passed in it, 1 if in or past the exchange of the next else 0)
Position = tuple[int, int, int]
_COMPUTING = (Phase.arrived, Phase.stepped)


def position(beat: ProgressBeat | None, decided: int | None) -> Position:
    """Where `beat` puts its member, as far as the authority can tell: never past the
    `decided` votes of its epoch (None: not known here), and a vote cast no further than
    the exchange it ends (the ballot says nothing the exchange did not)."""
    if beat is None:
        return (-1, 0, 0)
    vote = beat.vote if decided is None else min(beat.vote, decided)
    return (beat.epoch, vote, 0 if beat.phase in _COMPUTING else 1)


class ProgressWatch:
    """What the authority knows of its members' progress.

    Reports are compared across epochs as (epoch, count): members switch to a new
    epoch only at a step boundary, so the previous epoch's progress still counts.
    Only veterans (members that hold the job's state: they were in the previous
    epoch) set the pace: a joiner waiting at the barrier never gets the members
    it is waiting for fenced, and so never costs the job its state.
    """

    def __init__(self, config: LivenessConfig) -> None:
        self.config = config
        self.epoch, self._started_at = -1, 0.0
        self._veterans: frozenset[str] = frozenset()
        self._lead: Position = (-1, 0, 0)
        self._lead_arrived = True  # the lead's members are only at the epoch's barrier
        self._lead_at = 0.0
        self._seen: dict[str, tuple[int, int, int] | None] = {}  # last (epoch, count, waits)
        self._changed_at: dict[str, float] = {}  # when that last changed
        self._advanced_at: dict[str, float] = {}  # when the member last made progress
        # Each member's own pace: the newest step it reported and when that was first seen,
        # and its step times since. A member's word moves only its own pace.
        self._sighted: dict[str, tuple[int, float]] = {}
        self._paces: dict[str, deque[float]] = {}
        self.rtt_s = 0.0  # the slowest member's round trip to the store, as reported

    def reset(self, epoch: int, now: float, veterans: tuple[str, ...] = ()) -> None:
        """A new epoch was published; `veterans` were members of the previous one.
        Everyone now has to reach it: whoever was behind in the last epoch starts afresh."""
        self.epoch, self._started_at, self._veterans = epoch, now, frozenset(veterans)
        self._lead_at = now

    def step_deadline_s(self) -> float:
        """From the slowest member's median step time (members that reported a few steps):
        a member that claims steps it never took speeds up only its own pace, so it
        cannot shorten the deadline its peers are held to."""
        floor = max(self.config.floor_s, self.config.rtt_multiple * self.rtt_s)
        paces = [statistics.median(p) for p in self._paces.values() if len(p) >= 3]
        if not paces:
            return max(floor, self.config.initial_s)
        return max(floor, self.config.step_multiple * max(paces) + self.config.margin_s)

    def _deadline_s(self) -> float:
        # While the lead has only arrived at the newest epoch, the others may still be
        # finishing a step in the previous one.
        arriving = self._lead[0] == self.epoch and self._lead_arrived
        return self.step_deadline_s() * (2 if arriving else 1)

    def laggards(self, beats: dict[str, ProgressBeat | None], now: float,
                 decided: Callable[[int], int | None] = lambda epoch: None) -> list[str]:
        """Members behind the lead, or silent while a veteran waits, past the deadline.
        `decided(epoch)`: the votes decided so far in that epoch (None: unknown); read
        after `beats`, so that no honest member is ever past it."""
        positions = self._observe(beats, now, decided)
        self.rtt_s = max((b.rtt_s or 0.0 for b in beats.values() if b is not None), default=0.0)
        self._measure_steps(beats, now)
        pace = [w for w in positions if w in self._veterans] or list(positions)
        lead = max((positions[w] for w in pace), default=(-1, 0, 0))
        if lead != self._lead:
            self._lead, self._lead_at = lead, now
        self._lead_arrived = all(beats[w] is None or beats[w].phase is Phase.arrived
                                 for w in pace if positions[w] == lead)
        deadline = self._deadline_s()
        behind = [w for w, at in positions.items() if at < lead
                  and now - max(self._behind_since(w), self._advanced_at[w]) > deadline]
        quiet = [w for w in positions if now - self._changed_at[w] > deadline and w not in behind]
        silent = [w for w in quiet
                  if any(o != w and now - self._changed_at[o] <= deadline
                         and positions[o] >= positions[w] for o in pace)]
        return behind + silent

    def _observe(self, beats: dict[str, ProgressBeat | None], now: float,
                 decided: Callable[[int], int | None]) -> dict[str, Position]:
        for worker, beat in beats.items():
            key = None if beat is None else (beat.epoch, beat.count, beat.waits)
            if worker not in self._changed_at or self._seen.get(worker) != key:
                seen = self._seen.get(worker)
                # Progress: a new point, or, while forming an epoch (at its barrier, or
                # receiving the live state over a slow link), a refreshed one.
                if (worker not in self._advanced_at or seen is None or key is None
                        or key[:2] != seen[:2] or beat.phase is Phase.arrived):
                    self._advanced_at[worker] = now
                self._seen[worker], self._changed_at[worker] = key, now
        return {w: position(b, None if b is None else decided(b.epoch))
                for w, b in beats.items()}

    def _behind_since(self, worker: str) -> float:
        # A newcomer is behind from the moment it was admitted, not from when the lead
        # got where it is.
        if worker in self._veterans:
            return self._lead_at
        return max(self._lead_at, self._started_at)

    def seconds_to_next_deadline(self, now: float) -> float:
        oldest = min([self._lead_at, *self._changed_at.values()])
        return max(0.0, oldest + self._deadline_s() - now)

    def _measure_steps(self, beats: dict[str, ProgressBeat | None], now: float) -> None:
        """Each member's step time: between first sightings of its later steps (the
        authority may see several pass between two looks; each gets an equal part). Any
        phase counts: a member's reporter sends only its latest point, so a look may never
        catch a vote. A member seen at an earlier step (rolled back) starts over."""
        for worker in [w for w in self._sighted if w not in beats]:
            del self._sighted[worker]  # no longer a member: its pace no longer counts
            self._paces.pop(worker, None)
        for worker, beat in beats.items():
            if beat is None:
                continue
            seen = self._sighted.get(worker)
            if seen is None or beat.step < seen[0]:
                self._sighted[worker] = (beat.step, now)
            elif beat.step > seen[0]:
                pace = self._paces.setdefault(worker, deque(maxlen=self.config.history))
                pace.append((now - seen[1]) / (beat.step - seen[0]))
                self._sighted[worker] = (beat.step, now)
