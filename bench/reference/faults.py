"""The fault schedule the reference harnesses share: SIGKILL one worker process
every `interval_s`, once the job is steady and the previous fault's recovery
can be measured, then keep running until the last one's can too.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Protocol

from bench.reference.common import (
    ReferenceRunError, RunDirectory, read_step_logs, steps_started_after,
)

# recovery_s needs settle_steps + window (3 + 15) steps after the first one
# that follows a fault; a few more keep a slow step from leaving it short.
MEASURE_STEPS = 25


@dataclass(frozen=True)
class KillSchedule:
    kills: int
    interval_s: float
    warmup_steps: int = 30  # committed steps before the first kill (start-up, allocator warm-up)
    wait_limit_s: float = 180.0  # longest wait for any one phase before the run counts as hung

    def __post_init__(self) -> None:
        if self.kills < 1 or self.interval_s <= 0:
            raise ValueError("kills must be at least 1 and interval_s positive")


class FaultTarget(Protocol):
    """The system under test, as the kill loop sees it."""

    def healthy(self) -> None:
        """Raise ReferenceRunError if the system died instead of recovering."""

    def prepare_kill(self, k: int) -> None:
        """Get ready for kill k (e.g. start a warm spare); runs while the job trains."""

    def victim_pid(self, k: int) -> int:
        """The worker process to SIGKILL k-th."""

    def after_kill(self, k: int) -> None:
        """Runs right after kill k (e.g. hand the spare its slot)."""


def run_kills(run: RunDirectory, schedule: KillSchedule, target: FaultTarget) -> list[float]:
    """Kill `schedule.kills` workers; return the wall times (time.time()) of the kills."""
    _wait_for_steps(run, schedule, 0.0, schedule.warmup_steps, target, "warm-up steps")
    faults: list[float] = []
    last = time.time()
    for k in range(schedule.kills):
        if faults:
            _wait_for_steps(run, schedule, faults[-1], MEASURE_STEPS, target,
                            f"{MEASURE_STEPS} steps after kill {k}")
        target.prepare_kill(k)
        _sleep_until(last + schedule.interval_s, target)
        pid = target.victim_pid(k)
        fault_t = time.time()
        os.kill(pid, signal.SIGKILL)
        target.after_kill(k)
        faults.append(fault_t)
        last = fault_t
    _wait_for_steps(run, schedule, faults[-1], MEASURE_STEPS, target,
                    f"{MEASURE_STEPS} steps after the last kill")
    return faults


def _wait_for_steps(run: RunDirectory, schedule: KillSchedule, since_t: float, count: int,
                    target: FaultTarget, what: str) -> None:
    deadline = time.monotonic() + schedule.wait_limit_s
    while steps_started_after(read_step_logs(run.logs), since_t) < count:
        target.healthy()
        if time.monotonic() > deadline:
            raise ReferenceRunError(f"no progress: waited {schedule.wait_limit_s:.0f} s for {what}")
        time.sleep(0.2)


def _sleep_until(t: float, target: FaultTarget) -> None:
    while time.time() < t:
        target.healthy()
        time.sleep(min(0.2, max(0.0, t - time.time())))
