"""What the run asks of a sync mode (every-step, DiLoCo, stale DiLoCo): the one
`Sync` protocol, the step it is told about, and the narrow proof calls a mode
with local rounds makes. The run asks the protocol, never which class it holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from shoal.train.group import EpochGroup, ShouldCancel

InnerStep = Callable[[], None]  # install the gradients, clip, step the user's optimizer


@dataclass(frozen=True)
class StepWork:
    """The step being exchanged, as the sync needs to know it."""

    step: int  # its index
    share: int  # samples this worker computed on
    shares: tuple[int, ...]  # every rank's samples
    global_batch: int


class RoundProof(Protocol):
    """The proof calls a mode with local rounds makes (`shoal.train.hooks.StepHook`
    has them): where a worker's own step ended, and what it sends at a round's end."""

    def local_stepped(self, applied: bool) -> None: ...

    def outer(self, pseudo_gradient: torch.Tensor, round_samples: int,
              round_expected: int) -> torch.Tensor: ...

    def sent_count(self, count: int) -> int: ...


class Sync(Protocol):
    """How a step's contributions become one update on every replica."""

    consensus: bool  # the model holds what every replica holds (for hashes, snapshots)
    samples_dropped: int  # at the step just applied, with a lost member's work (step log)
    slt_seen: int | None  # bounded staleness's figures at the step just applied (step log)
    rounds_late: int
    rounds_dropped: int
    steps_per_vote: int  # steps between exchanges (DiLoCo's H; 1 for every step)
    # Workers step alone between voted steps (DiLoCo's inner steps): their work records
    # claim their own steps, and a voted step ends a round.
    local_steps: bool

    @property
    def bytes_sent(self) -> int: ...

    def plan(self, steps: int) -> None: ...

    def votes(self, step: int) -> bool: ...

    def round_begins_at(self, step: int) -> int: ...

    def fingerprint(self) -> tuple[int, int]: ...

    def new_epoch(self, epoch: int) -> None: ...

    def exchange_step(self, group: EpochGroup, should_cancel: ShouldCancel, work: StepWork,
                      inner_step: InnerStep) -> None: ...

    def step_alone(self, work: StepWork, inner_step: InnerStep, applied: bool) -> None: ...

    def checked(self) -> list[torch.Tensor]: ...

    def apply(self, inner_step: InnerStep) -> None: ...

    def skip(self) -> None: ...

    def rolled_back(self) -> None: ...

    def agreed_sha256(self, model: torch.nn.Module) -> str | None: ...

    def agreed(self) -> contextlib.AbstractContextManager[None]: ...

    def summed_sent(self) -> list[torch.Tensor]: ...

    def sent_counts(self) -> dict[str, int]: ...

    def record_work(self, proof: RoundProof) -> None:
        """The job records work: keep what the sent check needs, and make the proof
        calls of local rounds to `proof`. Raises TrainError where this mode cannot be
        recorded."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...
