"""What the report's charts plot, from a job's committed steps and membership
epochs: loss over time, throughput smoothed over a window of commits, and
each member's spans. dashboard.js computes the same in the browser."""

from __future__ import annotations

from collections.abc import Sequence

from shoal.coordinator.dashboard.svg import Row
from shoal.spec.progress import MembershipChange, StepProgress

PACE_WINDOW = 8  # commits averaged over: one slow step should not look like a fault


def loss_points(progress: Sequence[StepProgress], t0: float) -> list[tuple[float, float | None]]:
    return [(p.t - t0, p.loss) for p in progress]


def throughput_points(progress: Sequence[StepProgress], t0: float,
                      window: int = PACE_WINDOW) -> list[tuple[float, float | None]]:
    """Samples per second at each commit: the samples of the last `window` steps over
    the time since the commit before them (fewer at the start)."""
    out: list[tuple[float, float | None]] = []
    for i in range(1, len(progress)):
        first = max(0, i - window)
        seconds = progress[i].t - progress[first].t
        samples = sum(p.samples for p in progress[first + 1:i + 1])
        out.append((progress[i].t - t0, samples / seconds if seconds > 0 else None))
    return out


def member_rows(membership: Sequence[MembershipChange], t0: float, end_s: float) -> list[Row]:
    """Each member's spans: from the epoch that has it to the next epoch without it
    (the last epoch lasts until `end_s`, seconds from t0)."""
    changes = sorted(membership, key=lambda c: c.t)
    spans: dict[str, list[tuple[float, float]]] = {}
    for i, change in enumerate(changes):
        start = change.t - t0
        end = changes[i + 1].t - t0 if i + 1 < len(changes) else end_s
        for member in change.members:
            held = spans.setdefault(member, [])
            if held and abs(held[-1][1] - start) < 1e-9:
                held[-1] = (held[-1][0], end)  # still a member: one bar, not one per epoch
            else:
                held.append((start, end))
    return [Row(name=name, spans=tuple(s)) for name, s in spans.items()]
