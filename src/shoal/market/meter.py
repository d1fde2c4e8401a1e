"""Per-second billing of a job's leases against its escrow, and when to pause.

A lease bills its price for each whole second it has run, like the ledger
books whole verified seconds, so nobody is billed past the time a device was
held. Projections look ahead on the leases as they stand, so a job can be
paused at a step boundary *before* its escrow would be exceeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shoal.spec.market import DeviceLease


def billed_seconds(lease: DeviceLease, now_s: float) -> int:
    """Whole seconds the lease has run by `now_s` (0 before it starts or if ended before)."""
    end = now_s if lease.ends_at_s is None else min(now_s, lease.ends_at_s)
    return max(0, math.floor(end - lease.start_s))


def charge_wei(lease: DeviceLease, now_s: float) -> int:
    """What the lease has cost by `now_s`, at the price fixed when it was made."""
    return lease.price_wei_per_s * billed_seconds(lease, now_s)


def _running_between(lease: DeviceLease, start_s: float, end_s: float) -> bool:
    ends = math.inf if lease.ends_at_s is None else lease.ends_at_s
    return lease.start_s <= start_s and end_s <= ends


@dataclass(frozen=True)
class JobMeter:
    """A snapshot of one job's leases and escrow; every answer is for a time you pass."""

    job: str
    budget_wei: int
    leases: tuple[DeviceLease, ...]

    def accrued_wei(self, now_s: float) -> int:
        return sum(charge_wei(lease, now_s) for lease in self.leases)

    def remaining_wei(self, now_s: float) -> int:
        return self.budget_wei - self.accrued_wei(now_s)

    def charges(self, now_s: float) -> dict[int, int]:
        """Wei owed per lease number by `now_s`: what each provider has earned."""
        return {lease.lease: charge_wei(lease, now_s) for lease in self.leases}

    def burn_wei_per_s(self, now_s: float) -> int:
        """Wei per second the leases running at `now_s` cost."""
        return sum(lease.price_wei_per_s for lease in self.leases
                   if lease.start_s <= now_s
                   and (lease.ends_at_s is None or lease.ends_at_s > now_s))

    def exhausted_at_s(self, now_s: float) -> float:
        """Earliest time the escrow could be spent, if nothing changes (inf: never).

        Charged continuously (price × real seconds), which is never less than
        whole-second billing, so the answer is early rather than late.
        """
        left = self.budget_wei - self._continuous_wei(now_s)
        if left <= 0:
            return now_s
        edges = sorted({t for lease in self.leases for t in (lease.start_s, lease.ends_at_s)
                        if t is not None and t > now_s})
        start = now_s
        for end in [*edges, math.inf]:
            rate = self._continuous_rate(start, end)
            if rate and left <= rate * (end - start):
                return start + left / rate
            if end != math.inf:
                left -= rate * (end - start)
            start = end
        return math.inf

    def seconds_until_budget_exhausted(self, now_s: float) -> float:
        return max(0.0, self.exhausted_at_s(now_s) - now_s)

    def should_pause(self, now_s: float, step_time_s: float, checkpoint_s: float = 0.0) -> bool:
        """At a step boundary: pause now, or would one more step and a checkpoint overspend?

        Taken at every boundary with an honest upper bound of the step time,
        spend never exceeds the escrow: the last step that runs was checked
        to fit, checkpoint included, before it started.
        """
        return self.accrued_wei(now_s + step_time_s + checkpoint_s) > self.budget_wei

    def _continuous_wei(self, now_s: float) -> float:
        total = 0.0
        for lease in self.leases:
            end = now_s if lease.ends_at_s is None else min(now_s, lease.ends_at_s)
            total += lease.price_wei_per_s * max(0.0, end - lease.start_s)
        return total

    def _continuous_rate(self, start_s: float, end_s: float) -> int:
        return sum(lease.price_wei_per_s for lease in self.leases
                   if _running_between(lease, start_s, end_s))


def stop_time_within(meter: JobMeter, now_s: float) -> float | None:
    """The latest time ≤ `now_s` to end the job's leases so billing stays in escrow.

    None when the escrow covers everything up to `now_s`. Steps back a whole
    second at a time to absorb float error in the projection, so the integer
    bill at the returned time is within the budget exactly.
    """
    if not meter.leases:
        return None
    crossing = meter.exhausted_at_s(min(lease.start_s for lease in meter.leases))
    if crossing > now_s:
        return None
    stop = crossing
    while meter.accrued_wei(stop) > meter.budget_wei:
        stop -= 1.0
    return stop
