"""The narrow hook through which proof of learning reaches a run: the few calls
`Run` makes at each step (which samples, what is sent, what a commit publishes).
Whoever joins the run hands one in (`shoal.join`); the runtime never imports verify.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from shoal.train.group import EpochGroup, ShouldCancel
from shoal.train.sync.exchange import GradientExchange
from shoal.train.sync.protocol import Sync


class SentChecked(Protocol):
    """A voted step's check of what every member declared it sent."""

    ok: bool  # the declarations arrived (False: the group failed; the step fails)
    refusal: str  # why the step must not be applied ("" if it may)


class StepHook(Protocol):
    """What a run calls at each step; `NoStepHook` when nobody records or cheats."""

    @property
    def active(self) -> bool:
        """Whether `begin` and `before_exchange` need calling at all."""

    @property
    def checks_sent(self) -> bool:
        """Whether voted steps check every member's declaration of what it sent."""

    def attach(self, sync: Sync, exchange: GradientExchange,
               optimizer: torch.optim.Optimizer) -> None:
        """`run.wrap` chose the sync: refuse what cannot run under it, prepare the rest."""

    def begin(self, step: int, rank: int, model: torch.nn.Module, positions: range,
              shares: tuple[int, ...], ids: np.ndarray, num_samples: int) -> np.ndarray:
        """At a step's start; returns the sample ids this worker will compute on."""

    def before_exchange(self, exchange: GradientExchange) -> None: ...

    def reported_loss(self, loss_sum: float) -> float: ...

    def check_sent(self, group: EpochGroup, sync: Sync, tail: tuple[float, ...],
                   summed_tail: tuple[float, ...], should_cancel: ShouldCancel) -> SentChecked: ...

    def hopeless(self, members: tuple[str, ...]) -> str | None:
        """Why the run cannot go on (members whose declarations never add up), if so."""

    def committed(self, membership_epoch: int, rolled_back_to: int | None = None) -> None:
        """The step committed everywhere and was applied (or skipped, or rolled back to the
        state step `rolled_back_to` started from): publish its record."""

    # A mode with local rounds (DiLoCo) calls these (`shoal.train.sync.protocol.RoundProof`).
    def local_stepped(self, applied: bool) -> None: ...

    def outer(self, pseudo_gradient: torch.Tensor, round_samples: int,
              round_expected: int) -> torch.Tensor: ...

    def sent_count(self, count: int) -> int: ...


class NoStepHook:
    """An honest worker that records nothing: every call leaves the step as it is."""

    active = False
    checks_sent = False

    def attach(self, sync: Sync, exchange: GradientExchange,
               optimizer: torch.optim.Optimizer) -> None:
        pass

    def begin(self, step: int, rank: int, model: torch.nn.Module, positions: range,
              shares: tuple[int, ...], ids: np.ndarray, num_samples: int) -> np.ndarray:
        return ids

    def before_exchange(self, exchange: GradientExchange) -> None:
        pass

    def reported_loss(self, loss_sum: float) -> float:
        return loss_sum

    def check_sent(self, group: EpochGroup, sync: Sync, tail: tuple[float, ...],
                   summed_tail: tuple[float, ...], should_cancel: ShouldCancel) -> SentChecked:
        raise AssertionError("check_sent is asked only where checks_sent is True")

    def hopeless(self, members: tuple[str, ...]) -> str | None:
        return None

    def committed(self, membership_epoch: int, rolled_back_to: int | None = None) -> None:
        pass

    def local_stepped(self, applied: bool) -> None:
        pass

    def outer(self, pseudo_gradient: torch.Tensor, round_samples: int,
              round_expected: int) -> torch.Tensor:
        return pseudo_gradient

    def sent_count(self, count: int) -> int:
        return count
