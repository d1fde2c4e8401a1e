"""Figures of one fault, computed the same way for every system from the
commits it logged: the survivor-rate RTO (shoal.elastic.recovery), the RTO
to the full world, and the time the fault cost the job.

A commit is (step, t_start, t_commit, world). Only commits that advance the
job count as progress: a step recomputed after a restart from a checkpoint
is work redone, not throughput.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from shoal.elastic.recovery import FULL_RATE, recovery_s


@dataclass(frozen=True)
class Commit:
    step: int
    t_start: float
    t_commit: float
    world: int
    attempt: int = 0  # torchrun's restart count, shoal's epoch; a redone step has a newer one


@dataclass(frozen=True)
class FaultFigures:
    t: float  # seconds from the system's start to the fault
    victim_rank: int
    rto_s: float | None  # survivor rate: shoal.elastic.recovery.recovery_s
    rto_full_s: float | None  # full world at 90% of the pre-fault rate (None: never in the window)
    lost_s: float | None  # window time minus the time the pre-fault full world needs for its work
    pause_s: float | None  # time the job stood still: commit gaps over 3 pre-fault steps, summed
    steps_lost: int  # committed before the fault and committed again after it
    pre_step_s: float | None  # median gap between commits before the fault (full world)


PRE_FAULT_STEPS = 10  # commits before a fault that set its pre-fault rate
SUSTAIN_STEPS = 3  # consecutive commits that must run at the full rate
STILL_STEPS = 3  # a gap between commits this many steps long is the job standing still
ATTEMPT_GAP_S = 0.5  # commits of one step further apart than this are separate attempts


def progress(commits: Sequence[Commit]) -> list[Commit]:
    """The first commit of every step index, in commit order, keeping only those that advance
    the job (a step above every step committed before it)."""
    first: dict[int, Commit] = {}
    for c in sorted(commits, key=lambda c: c.t_commit):
        first.setdefault(c.step, c)
    advancing, high = [], -1
    for c in sorted(first.values(), key=lambda c: c.t_commit):
        if c.step > high:
            advancing.append(c)
            high = c.step
    return advancing


def attempt_spans(commits: Sequence[Commit]) -> list[tuple[float, float]]:
    """(t_start, t_commit) per committed step attempt, merged over its workers, for recovery_s.

    Workers of one attempt commit within milliseconds of each other; a step done again
    after a restart commits seconds later and is an attempt of its own."""
    by_step: dict[int, list[Commit]] = {}
    for c in commits:
        by_step.setdefault(c.step, []).append(c)
    spans = []
    for group in by_step.values():
        group.sort(key=lambda c: c.t_commit)
        start, end = group[0].t_start, group[0].t_commit
        for c in group[1:]:
            if c.t_commit - end > ATTEMPT_GAP_S:
                spans.append((start, end))
                start = c.t_start
            start, end = min(start, c.t_start), c.t_commit
        spans.append((start, end))
    return sorted(spans)


def fault_figures(commits: Sequence[Commit], fault_t: float, next_t: float, launch_t: float,
                  victim_rank: int, full_world: int, window_s: float) -> FaultFigures:
    """Figures of the fault at `fault_t`, judged on what happened before `next_t`."""
    line = progress(commits)
    before = [c for c in line if c.t_commit <= fault_t][-(PRE_FAULT_STEPS + 1):]
    gaps = [b.t_commit - a.t_commit for a, b in zip(before, before[1:])]
    pre = statistics.median(gaps) if gaps else None
    after = [c for c in commits if fault_t <= c.t_start < next_t]
    # Redone: committed again after the fault in a newer attempt (a worker that was stopped
    # and commits the same attempt late has not redone anything).
    attempt_before: dict[int, int] = {}
    for c in commits:
        if c.t_commit <= fault_t:
            attempt_before[c.step] = max(c.attempt, attempt_before.get(c.step, -1))
    redone = {c.step for c in commits
              if c.t_commit > fault_t and c.attempt > attempt_before.get(c.step, c.attempt)}
    spans = attempt_spans(after)
    return FaultFigures(
        t=round(fault_t - launch_t, 3), victim_rank=victim_rank,
        rto_s=_r(recovery_s(spans, fault_t)),
        rto_full_s=_r(None if pre is None else _full_rate_from(line, fault_t, next_t, pre, full_world)),
        lost_s=_r(None if pre is None else _lost_s(line, fault_t, min(next_t, fault_t + window_s), pre)),
        pause_s=_r(None if pre is None else _pause_s(line, fault_t, min(next_t, fault_t + window_s),
                                                        pre)),
        steps_lost=len(redone), pre_step_s=_r(pre),
    )


def _full_rate_from(line: list[Commit], fault_t: float, next_t: float, pre_gap: float,
                    full_world: int) -> float | None:
    """Seconds from the fault to the commit that opens SUSTAIN_STEPS commits in a row, all in
    the full world, whose mean gap is within the pre-fault gap / 0.9."""
    index = next((i for i, c in enumerate(line) if c.t_commit > fault_t), None)
    if index is None or index == 0:
        return None
    for i in range(index, len(line) - SUSTAIN_STEPS + 1):
        run = line[i: i + SUSTAIN_STEPS]
        if run[-1].t_commit >= next_t:
            return None
        mean_gap = (run[-1].t_commit - line[i - 1].t_commit) / SUSTAIN_STEPS
        if all(c.world >= full_world for c in run) and mean_gap <= pre_gap / FULL_RATE:
            return max(0.0, line[i - 1].t_commit - fault_t)
    return None


def _lost_s(line: list[Commit], fault_t: float, end_t: float, pre_gap: float) -> float | None:
    """Wall time of [fault, end] minus the time the full world, at its pre-fault pace, would
    have needed for the steps the job advanced by in it: what the fault cost the job."""
    if not line or line[-1].t_commit < end_t:
        return None  # the log stops inside the window: the cost is not known
    advanced = sum(1 for c in line if fault_t < c.t_commit <= end_t)
    return max(0.0, (end_t - fault_t) - advanced * pre_gap)


def figures_of(commits: Sequence[Commit], applied: Sequence, launch_t: float,
               plan) -> list[FaultFigures]:
    """Figures of every fault a bench.fault_plan.drive applied (full world: plan.workers)."""
    times = [a.t for a in applied] + [float("inf")]
    return [fault_figures(commits, a.t, times[i + 1], launch_t, a.rank, plan.workers,
                          min(plan.interval_s, plan.tail_s) - 1.0) for i, a in enumerate(applied)]


def summary(faults: list[FaultFigures]) -> dict[str, object]:
    """A system's figures over all its faults: medians, and every fault as measured."""
    return {"rto_s": median([f.rto_s for f in faults]),
            "rto_full_s": median([f.rto_full_s for f in faults]),
            "lost_s": median([f.lost_s for f in faults]),
            "pause_s": median([f.pause_s for f in faults]),
            "median_step_s": median([f.pre_step_s for f in faults]),
            "steps_lost": sum(f.steps_lost for f in faults),
            "faults": [asdict(f) for f in faults]}


def _pause_s(line: list[Commit], fault_t: float, end_t: float, pre_gap: float) -> float | None:
    """Time without progress in [fault, end]: every gap between commits longer than
    STILL_STEPS pre-fault steps, less one step each. Unlike lost_s it does not move with
    the load of a shared machine, which changes step times by 2x but stops nothing."""
    if not line or line[-1].t_commit < end_t:
        return None
    before = [c.t_commit for c in line if c.t_commit <= fault_t][-1:]
    times = before + [c.t_commit for c in line if fault_t < c.t_commit <= end_t]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return sum(g - pre_gap for g in gaps if g > STILL_STEPS * pre_gap)


def median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(statistics.median(kept), 4) if kept else None


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
