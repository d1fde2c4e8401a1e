"""Liveness by progress: the authority fences a member that falls behind.

Every member reports the progress points it reaches in an epoch (arrived,
entered a step's exchange, voted: shoal.train.liveness), and refreshes its
point while it waits on peers. Two rules, one deadline:

- behind: the member that got furthest is the lead; a member still short
  of the lead's point after the deadline is fenced, whether its process is
  stopped, hung in its data loader or merely far slower than the rest;
- silent: a member whose report has not changed for the deadline while a
  member at the same point or further refreshed its own within it is
  fenced: everyone may be waiting in the same exchange, but the one that
  cannot reach the store (partitioned, frozen) is the one they wait for.

The deadline follows the job:
a multiple of the median step time plus a margin, never below a floor;
reaching an epoch's barrier gets twice that, since members finish the
step in flight before they switch epochs.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from shoal.control.errors import ControlError
from shoal.spec.elastic import ProgressBeat


@dataclass(frozen=True)
class LivenessConfig:
    floor_s: float = 1.0  # never fence a member sooner than this
    step_multiple: float = 3.0  # deadline: this many median step times ...
    margin_s: float = 0.25  # ... plus this
    initial_s: float = 10.0  # deadline until a few step times are measured
    history: int = 20  # step times in the median

    def __post_init__(self) -> None:
        if self.floor_s <= 0 or self.initial_s <= 0 or self.step_multiple < 1 or self.margin_s < 0:
            raise ControlError("liveness: floor_s and initial_s must be positive, "
                               "step_multiple at least 1, margin_s not negative")


class ProgressWatch:
    """What the authority knows of its members' progress in the current epoch."""

    def __init__(self, config: LivenessConfig) -> None:
        self.config = config
        self.reset(-1, 0.0)
        self._voted_step, self._voted_at = -1, 0.0
        self.step_times: deque[float] = deque(maxlen=config.history)

    def reset(self, epoch: int, now: float) -> None:
        """A new epoch was published: nobody has reached anything in it yet."""
        self.epoch, self._lead, self._lead_at = epoch, 0, now
        self._seen: dict[str, tuple[int, int]] = {}  # member: its last (count, waits)
        self._changed_at: dict[str, float] = {}  # member: when that last changed

    def step_deadline_s(self) -> float:
        if len(self.step_times) < 3:
            return max(self.config.floor_s, self.config.initial_s)
        typical = statistics.median(self.step_times)
        return max(self.config.floor_s, self.config.step_multiple * typical + self.config.margin_s)

    def _deadline_s(self) -> float:
        # While the lead has only arrived, the others may still be finishing a step.
        return self.step_deadline_s() * (2 if self._lead <= 1 else 1)

    def laggards(self, beats: dict[str, ProgressBeat | None], now: float) -> list[str]:
        """Members short of the lead's progress point for longer than the deadline."""
        current = {w: (b.count, b.waits) if b is not None and b.epoch == self.epoch else (0, 0)
                   for w, b in beats.items()}
        for worker, seen in current.items():
            if self._seen.get(worker) != seen:
                self._seen[worker], self._changed_at[worker] = seen, now
        self._measure_steps(beats, now)
        counts = {w: seen[0] for w, seen in current.items()}
        lead = max(counts.values(), default=0)
        if lead > self._lead:
            self._lead, self._lead_at = lead, now
        deadline = self._deadline_s()
        behind = [] if lead == 0 or now - self._lead_at <= deadline else \
            [w for w, count in counts.items() if count < lead]
        return behind + [w for w in self._silent(counts, now, deadline) if w not in behind]

    def _silent(self, counts: dict[str, int], now: float, deadline: float) -> list[str]:
        quiet = [w for w in counts if now - self._changed_at[w] > deadline]
        return [w for w in quiet
                if any(now - self._changed_at[o] <= deadline and counts[o] >= counts[w]
                       for o in counts if o != w)]

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
