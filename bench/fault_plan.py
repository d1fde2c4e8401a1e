"""One fault schedule for every system under test: the same fault, at the same
seconds after the system's start, to the same rank (rotating over ranks,
rank 0 first), then a replacement where the fault removed a worker.

The driver only sends signals and calls the target's hooks; each system's
target says which processes hold a rank, how to cut its host off, and how
its replacement comes in.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from dataclasses import dataclass
from typing import Protocol


class Fault(str, enum.Enum):
    kill = "kill"  # SIGKILL the rank's worker process
    host_kill = "host-kill"  # SIGKILL every process of the rank's host (its launcher/agent too)
    partition = "partition"  # drop every packet of the rank's host; never healed in the run
    stall = "stall"  # SIGSTOP the rank's worker for stall_s, then SIGCONT

    @property
    def removes_worker(self) -> bool:
        """Whether the victim is gone for good, so a replacement is called in."""
        return self is not Fault.stall


@dataclass(frozen=True)
class FaultPlan:
    fault: Fault
    count: int
    workers: int
    first_s: float = 25.0  # seconds after start of the first fault (all systems are steady by then)
    interval_s: float = 15.0
    stall_s: float = 5.0
    tail_s: float = 15.0  # the run goes on this long after the last fault

    def __post_init__(self) -> None:
        if self.count < 1 or self.interval_s <= self.stall_s or self.workers < 2:
            raise ValueError("count >= 1, workers >= 2 and interval_s > stall_s are required")

    def at_s(self, k: int) -> float:
        return self.first_s + k * self.interval_s

    def victim_rank(self, k: int) -> int:
        return k % self.workers

    @property
    def end_s(self) -> float:
        return self.at_s(self.count - 1) + self.tail_s

    def describe(self) -> dict[str, object]:
        return {"fault": self.fault.value, "count": self.count, "workers": self.workers,
                "at_s": [self.at_s(k) for k in range(self.count)],
                "victim_ranks": [self.victim_rank(k) for k in range(self.count)],
                "stall_s": self.stall_s if self.fault is Fault.stall else None}


class FaultTarget(Protocol):
    launch_t: float  # time.time() at the system's start; fault times count from it

    def healthy(self) -> None:
        """Raise if the system died instead of recovering."""

    def victim_pids(self, rank: int, whole_host: bool) -> list[int]:
        """The worker holding `rank` now (with every process of its host if whole_host)."""

    def partition(self, rank: int) -> None:
        """Cut the host of the worker holding `rank` off the network."""

    def replace(self, k: int) -> None:
        """Call a replacement in for fault k (a warm spare where the system has them)."""


@dataclass(frozen=True)
class Applied:
    t: float  # time.time() of the fault
    rank: int


def drive(plan: FaultPlan, target: FaultTarget) -> list[Applied]:
    """Apply the plan to `target`; returns when the run's tail has passed."""
    applied: list[Applied] = []
    resume: list[tuple[float, list[int]]] = []  # stalled processes and when to continue them
    for k in range(plan.count):
        _wait_until(target.launch_t + plan.at_s(k), target, resume)
        rank = plan.victim_rank(k)
        pids = [] if plan.fault is Fault.partition else target.victim_pids(
            rank, whole_host=plan.fault is Fault.host_kill)
        fault_t = time.time()
        if plan.fault is Fault.partition:
            target.partition(rank)
        elif plan.fault is Fault.stall:
            _signal(pids, signal.SIGSTOP)
            resume.append((fault_t + plan.stall_s, pids))
        else:
            _signal(pids, signal.SIGKILL)
        if plan.fault.removes_worker:
            target.replace(k)
        applied.append(Applied(fault_t, rank))
    _wait_until(target.launch_t + plan.end_s, target, resume)
    return applied


def _wait_until(t: float, target: FaultTarget, resume: list[tuple[float, list[int]]]) -> None:
    while (now := time.time()) < t:
        for item in [r for r in resume if r[0] <= now]:
            _signal(item[1], signal.SIGCONT)
            resume.remove(item)
        target.healthy()
        wake = min([t] + [r[0] for r in resume])
        time.sleep(min(0.05, max(0.0, wake - now)))
    for item in [r for r in resume if r[0] <= time.time()]:
        _signal(item[1], signal.SIGCONT)
        resume.remove(item)


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
