"""The fault schedule the reference harnesses share: SIGKILL one worker process
every `interval_s`, once the job is steady and the previous fault's recovery
can be measured, then keep running until the last one's can too.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

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


def run_kills(run: RunDirectory, schedule: KillSchedule, victim_pid: Callable[[int], int],
              after_kill: Callable[[int], None], healthy: Callable[[], None]) -> list[float]:
    """Kill `schedule.kills` workers; return the wall times (time.time()) of the kills.

    `victim_pid(k)` names the process to kill k-th, `after_kill(k)` runs right
    after it (e.g. respawn a replica), `healthy()` raises if the system died.
    """
    _wait_for_steps(run, schedule, 0.0, schedule.warmup_steps, healthy, "warm-up steps")
    faults: list[float] = []
    last = time.time()
    for k in range(schedule.kills):
        if faults:
            _wait_for_steps(run, schedule, faults[-1], MEASURE_STEPS, healthy,
                            f"{MEASURE_STEPS} steps after kill {k}")
        _sleep_until(last + schedule.interval_s, healthy)
        pid = victim_pid(k)
        fault_t = time.time()
        os.kill(pid, signal.SIGKILL)
        after_kill(k)
        faults.append(fault_t)
        last = fault_t
    _wait_for_steps(run, schedule, faults[-1], MEASURE_STEPS, healthy,
                    f"{MEASURE_STEPS} steps after the last kill")
    return faults


def _wait_for_steps(run: RunDirectory, schedule: KillSchedule, since_t: float, count: int,
                    healthy: Callable[[], None], what: str) -> None:
    deadline = time.monotonic() + schedule.wait_limit_s
    while steps_started_after(read_step_logs(run.logs), since_t) < count:
        healthy()
        if time.monotonic() > deadline:
            raise ReferenceRunError(f"no progress: waited {schedule.wait_limit_s:.0f} s for {what}")
        time.sleep(0.2)


def _sleep_until(t: float, healthy: Callable[[], None]) -> None:
    while time.time() < t:
        healthy()
        time.sleep(min(0.2, max(0.0, t - time.time())))
