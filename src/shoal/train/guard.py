"""A guard against poisoned steps: NaN or Inf in the loss or the gradients,
or a loss spike, and the step is not applied; several bad steps in a row,
and the model rolls back to the last good state it kept in memory.

Every replica sees the same all-reduced loss and gradients, so every
replica reaches the same verdict without talking.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections import deque
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True
    spike_factor: float = 3.0  # a loss above this × the recent median is a spike
    history: int = 20  # steps in the recent median
    warmup_steps: int = 20  # no spike check until this many good steps
    rollback_after: int = 3  # consecutive bad steps that trigger a rollback
    snapshot_interval: int = 50  # steps between in-memory "last good" snapshots

    def __post_init__(self) -> None:
        if self.spike_factor <= 1.0:
            raise ValueError("guard spike_factor must be above 1")
        if self.rollback_after < 1 or self.snapshot_interval < 1:
            raise ValueError("guard rollback_after and snapshot_interval must be at least 1")


class Verdict(enum.Enum):
    apply = "apply"
    skip = "skip"  # do not apply this step
    rollback = "rollback"  # do not apply, and restore the last good state


class StepGuard:
    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.recent: deque[float] = deque(maxlen=config.history)
        self.bad_streak = 0
        self.skipped = 0
        self.rollbacks = 0

    def judge(self, loss: float, gradients: torch.Tensor) -> tuple[Verdict, str]:
        if not self.config.enabled:
            return Verdict.apply, ""
        reason = self._problem(loss, gradients)
        if not reason:
            self.bad_streak = 0
            self.recent.append(loss)
            return Verdict.apply, ""
        self.bad_streak += 1
        self.skipped += 1
        if self.bad_streak >= self.config.rollback_after:
            self.bad_streak = 0
            self.rollbacks += 1
            return Verdict.rollback, reason
        return Verdict.skip, reason

    def _problem(self, loss: float, gradients: torch.Tensor) -> str:
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if not bool(torch.isfinite(gradients).all()):
            return "gradients hold NaN or Inf"
        if len(self.recent) >= self.config.warmup_steps:
            typical = statistics.median(self.recent)
            if loss > self.config.spike_factor * typical:
                return f"loss spike {loss:.3f} > {self.config.spike_factor} × median {typical:.3f}"
        return ""

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "bad_streak": self.bad_streak,
                "skipped": self.skipped, "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict) -> None:
        self.recent = deque(state["recent"], maxlen=self.config.history)
        self.bad_streak, self.skipped, self.rollbacks = (
            state["bad_streak"], state["skipped"], state["rollbacks"])
