"""Steps that keep failing with no fault to see: who to hold out, and when to give up.

A step fails when any member's exchange fails. A member that withholds its part
of an exchange while it keeps beating (issue 40: a lease that wants the job
ended) looks, to everyone, like a path that drops traffic: its peers wait in
the collective until it times out, and nothing says who held them. Re-forming
the same members repeats it; before, `max_failed_reforms` of those gave the
whole run up, so one lease could end any job.

Nothing a member says can tell the withholder from its peers: it chooses when
to take part, so any test it sits in, it passes. What the host can do is keep
the job going: after `probe_after` failures with the same steps done, it holds
one member out (the next one, in turn) and re-forms the rest. If that epoch
commits a step, the job goes on without that member for `hold_s` (shorter than
the coordinator's grace for a member that is not in the job, so a lease held
out is neither ended nor barred: no member is blamed), then takes it back. If
it fails too, the next member is held out instead. Only when every member has
been held out once and still no step commits is the run given up: then no one
member is the cause. The member whose absence last let a step commit is held
out first, at the first failure of the next streak (a suspect, never blamed:
only the order changes), so a withholder that comes back and withholds again
costs one failed exchange per `hold_s`, not the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROBE_AFTER = 2  # failed steps with the same steps done before a member is held out
# Under the coordinator's member_grace_s (120 s): a member held out this long is not
# taken for a lease that squats.
HOLD_S = 60.0


@dataclass(frozen=True)
class Reform:
    """Re-form the same members."""


@dataclass(frozen=True)
class HoldOut:
    """Re-form `members`: the failing ones without `out`."""

    members: tuple[str, ...]
    out: str


@dataclass(frozen=True)
class GiveUp:
    reason: str


@dataclass
class FailedSteps:
    """The authority's record of failed steps since the last step that committed."""

    max_reforms: int  # plain re-forms tolerated where no member can be held out
    probe_after: int = PROBE_AFTER
    hold_s: float = HOLD_S
    _steps_done: int | None = None  # the steps done when this streak of failures began
    _failures: int = 0
    _base: tuple[str, ...] = ()  # the members that first failed
    _tried: list[str] = field(default_factory=list)  # held out since, in turn
    _turn: int = 0  # where the next streak starts holding out (so each takes its turn)
    _suspect: str | None = None  # the member whose absence last let a step commit
    _held: dict[str, float] = field(default_factory=dict)  # member -> held out until

    def failed(self, members: tuple[str, ...], steps_done: int, now: float, *,
               hold_out: bool = True) -> Reform | HoldOut | GiveUp:
        """A step of `members` failed with `steps_done` steps done: what the authority does
        next. `hold_out`: whether a member may be held out (not for a resync, whose
        members must all take the source's state)."""
        if steps_done != self._steps_done:
            self.forget(steps_done)
            self._steps_done, self._base = steps_done, members
        self._failures += 1
        first = self._suspect in self._base and not self._tried
        if not hold_out or len(self._base) < 2 or (self._failures < self.probe_after
                                                    and not first):
            if self._failures > self.max_reforms:
                return GiveUp(f"step {steps_done} failed {self._failures - 1} times in a row "
                              f"with the same members {list(members)} and no fault the "
                              "authority could see")
            return Reform()
        order = [m for m in (self._suspect,) if m in self._base]
        order += [m for m in _rotated(self._base, self._turn) if m not in order]
        left = [m for m in order if m not in self._tried]
        if not left:
            return GiveUp(f"step {steps_done} failed with every one of {list(self._base)} "
                          "held out in turn, and no fault the authority could see")
        out = left[0]
        self._tried.append(out)
        self._held = {m: t for m, t in self._held.items() if m not in self._base}
        self._held[out] = now + self.hold_s
        return HoldOut(tuple(m for m in self._base if m != out), out)

    def forget(self, steps_done: int) -> None:
        """A streak ends: a step committed (`steps_done` moved), or a fault or a join
        changed the members. If a step committed with the last member held out, that one
        is the suspect; the rotation goes on after it (none is held out twice before the
        others once)."""
        if self._tried and steps_done != self._steps_done:
            self._suspect = self._tried[-1]
        self._turn += len(self._tried)
        self._steps_done, self._failures, self._base, self._tried = None, 0, (), []

    def holds(self, worker: str, now: float) -> bool:
        """Is `worker` held out now (not to be admitted back yet)?"""
        until = self._held.get(worker)
        if until is not None and until <= now:
            del self._held[worker]
            return False
        return until is not None


def _rotated(members: tuple[str, ...], turn: int) -> list[str]:
    k = turn % len(members)
    return list(members[k:] + members[:k])
