"""Recovery figures from step logs: the same arithmetic for shoal and for the
reference systems (torchrun, torchft), so that their RTOs compare fairly.

Pure Python; a step log is a list of (t_start, t_commit) per committed step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

# A step "runs at full rate" when it takes at most this much longer than the steady step.
FULL_RATE = 0.9


def steady_step_s(spans: Sequence[tuple[float, float]]) -> float:
    """Median duration of committed steps (t_commit - t_start)."""
    if not spans:
        raise ValueError("no steps to measure")
    return statistics.median(end - start for start, end in spans)


def recovery_s(spans: Sequence[tuple[float, float]], fault_t: float,
               settle_steps: int = 3, window: int = 15) -> float | None:
    """RTO: from `fault_t` until the start of the first step that runs at >= 90% of
    the steady rate of the remaining workers, i.e. takes at most steady/0.9.

    The steady duration is the median of `window` steps taken `settle_steps`
    after the first committed step that started after the fault. None if the
    log does not reach that far.
    """
    after = sorted(s for s in spans if s[0] >= fault_t)
    if len(after) < settle_steps + 2:
        return None
    steady = steady_step_s(after[settle_steps: settle_steps + window])
    for start, end in after:
        if end - start <= steady / FULL_RATE:
            return max(0.0, start - fault_t)
    return None


def steps_lost(committed_before: Sequence[int], resumed_from: int) -> int:
    """Committed steps that a restart undid: those at or past the resume point."""
    return sum(1 for step in committed_before if step >= resumed_from)
