"""A guard against poisoned steps: NaN or Inf in the loss or the gradients,
or a loss spike, and the step is not applied; several bad steps in a row,
and the model rolls back to the last good state it kept in memory.

Every replica assesses the same all-reduced loss and gradients, and the
verdict that stands is the one in the step's commit decision (the
strictest any member reached), so a rollback happens everywhere or nowhere.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import torch

from shoal.spec.elastic import GuardVerdict as Verdict


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


class StepGuard:
    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.recent: deque[float] = deque(maxlen=config.history)
        self.bad_streak = 0
        self.skipped = 0
        self.rollbacks = 0

    def assess(self, loss: float | None,
               gradients: torch.Tensor | list[torch.Tensor]) -> tuple[Verdict, str]:
        """This member's verdict on a step; changes nothing until `record`."""
        if not self.config.enabled:
            return Verdict.apply, ""
        reason = self._problem(loss, gradients)
        if not reason:
            return Verdict.apply, ""
        if self.bad_streak + 1 >= self.config.rollback_after:
            return Verdict.rollback, reason
        return Verdict.skip, reason

    def record(self, verdict: Verdict, loss: float | None) -> None:
        """Account for the verdict the step's decision carries (the same on every member)."""
        if verdict is Verdict.apply:
            self.bad_streak = 0
            if self.config.enabled and loss is not None:
                self.recent.append(loss)
            return
        self.skipped += 1
        self.bad_streak += 1
        if verdict is Verdict.rollback:
            self.bad_streak = 0
            self.rollbacks += 1

    def judge(self, loss: float | None,
              gradients: torch.Tensor | list[torch.Tensor]) -> tuple[Verdict, str]:
        """Assess and record at once (a single worker has no one to agree with)."""
        verdict, reason = self.assess(loss, gradients)
        self.record(verdict, loss)
        return verdict, reason

    def _problem(self, loss: float | None, gradients: torch.Tensor | list[torch.Tensor]) -> str:
        """What is wrong with the step, or "". The loss is None when the loop never
        reported one (plain `loss.backward()`): then only gradients are checked."""
        if loss is not None and not math.isfinite(loss):
            return f"loss is {loss}"
        if not all(bool(torch.isfinite(g).all()) for g in
                   (gradients if isinstance(gradients, list) else [gradients])):
            return "gradients hold NaN or Inf"
        if loss is not None and len(self.recent) >= self.config.warmup_steps:
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
