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


Position = tuple[int, int]  # (epoch, progress points reached in it)


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
        self._lead: Position = (-1, 0)
        self._lead_at = 0.0
        self._seen: dict[str, tuple[int, int, int] | None] = {}  # last (epoch, count, waits)
        self._changed_at: dict[str, float] = {}  # when that last changed
        self._advanced_at: dict[str, float] = {}  # when the member last made progress
        self._voted_step, self._voted_at = -1, 0.0
        self.step_times: deque[float] = deque(maxlen=config.history)
        self.rtt_s = 0.0  # the slowest member's round trip to the store, as reported

    def reset(self, epoch: int, now: float, veterans: tuple[str, ...] = ()) -> None:
        """A new epoch was published; `veterans` were members of the previous one.
        Everyone now has to reach it: whoever was behind in the last epoch starts afresh."""
        self.epoch, self._started_at, self._veterans = epoch, now, frozenset(veterans)
        self._lead_at = now

    def step_deadline_s(self) -> float:
        floor = max(self.config.floor_s, self.config.rtt_multiple * self.rtt_s)
        if len(self.step_times) < 3:
            return max(floor, self.config.initial_s)
        typical = statistics.median(self.step_times)
        return max(floor, self.config.step_multiple * typical + self.config.margin_s)

    def _deadline_s(self) -> float:
        # While the lead has only arrived at the newest epoch, the others may still be
        # finishing a step in the previous one.
        arriving = self._lead[0] == self.epoch and self._lead[1] <= 1
        return self.step_deadline_s() * (2 if arriving else 1)

    def laggards(self, beats: dict[str, ProgressBeat | None], now: float) -> list[str]:
        """Members behind the lead, or silent while a veteran waits, past the deadline."""
        positions = self._observe(beats, now)
        self.rtt_s = max((b.rtt_s or 0.0 for b in beats.values() if b is not None), default=0.0)
        self._measure_steps(beats, now)
        pace = [w for w in positions if w in self._veterans] or list(positions)
        lead = max((positions[w] for w in pace), default=(-1, 0))
        if lead != self._lead:
            self._lead, self._lead_at = lead, now
        deadline = self._deadline_s()
        behind = [w for w, at in positions.items() if at < lead
                  and now - max(self._behind_since(w), self._advanced_at[w]) > deadline]
        quiet = [w for w in positions if now - self._changed_at[w] > deadline and w not in behind]
        silent = [w for w in quiet
                  if any(o != w and now - self._changed_at[o] <= deadline
                         and positions[o] >= positions[w] for o in pace)]
        return behind + silent

    def _observe(self, beats: dict[str, ProgressBeat | None], now: float) -> dict[str, Position]:
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
        return {w: (b.epoch, b.count) if b is not None else (-1, 0) for w, b in beats.items()}

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
        """Step time: between first sightings of later steps in any member's report (the
        authority may see several steps pass between two looks; each gets an equal part).
        Any phase counts: a member's reporter sends only its latest point, so a look may
        never catch a vote."""
        steps = [b.step for b in beats.values() if b is not None]
        if not steps or max(steps) <= self._voted_step:
            return
        newest = max(steps)
        if self._voted_step >= 0:
            self.step_times.append((now - self._voted_at) / (newest - self._voted_step))
        self._voted_step, self._voted_at = newest, now
