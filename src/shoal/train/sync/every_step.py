"""How a step's contributions become one update on every replica.

`EveryStep` exchanges gradients at every step: one plain all-reduce (exact,
today's path), a robust rule's all-gather, or a codec with error feedback
(then only the small scalar tail is all-reduced beside it). DiLoCo
(`shoal.train.sync.diloco`) takes local steps and exchanges pseudo-gradients;
with `slt > 0` (`shoal.train.sync.staleness`) it does so in the background.
The run talks to each through the `Sync` protocol (`shoal.train.sync.protocol`;
`shoal.train.sync.modes.make_sync` chooses one); a step the sync does not vote on (a DiLoCo inner step) is taken by `step_alone`, with nothing
crossing the network.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from shoal.train.errors import TrainError
from shoal.train.sync.codecs import Codec
from shoal.train.sync.codecs.base import ShouldCancel, ring_all_gather_bytes, ring_all_reduce_bytes
from shoal.train.sync.exchange import GradientExchange
from shoal.train.fingerprint import fingerprint
from shoal.train.group import EpochGroup
from shoal.train.hashing import param_sha256
from shoal.train.sync.protocol import InnerStep, RoundProof, StepWork


class EveryStep:
    """Gradients exchanged every step; every replica applies the same update."""

    consensus = True  # the model always holds the parameters every replica holds
    local_steps = False  # every step is exchanged: no worker steps alone
    slt_seen: int | None = None  # no outer rounds, so none applied late or dropped
    rounds_late = rounds_dropped = 0

    def __init__(self, exchange: GradientExchange, codec: Codec | None) -> None:
        self.exchange, self.codec = exchange, codec
        self._plain_bytes = 0
        self.samples_dropped = 0  # never, in this mode
        self.keep_sum = False  # with work records: a robust rule's gather keeps the sum
        self._summed: list[torch.Tensor] | None = None

    @property
    def bytes_sent(self) -> int:
        """On the wire by this worker (ring model), every attempt counted."""
        return self._plain_bytes + (self.codec.bytes_sent if self.codec is not None else 0)

    def plan(self, steps: int) -> None:
        """The run will stop after `steps` (DiLoCo closes its last round there)."""

    def fingerprint(self) -> tuple[int, int]:
        return fingerprint(self.exchange.params)

    steps_per_vote = 1  # every step is exchanged and voted on

    def votes(self, step: int) -> bool:
        """Does `step` go through the exchange and the vote? Here, every step."""
        return True

    def round_begins_at(self, step: int) -> int:
        return step  # each step is its own round

    def step_alone(self, work: StepWork, inner_step: InnerStep, applied: bool) -> None:
        raise TrainError(f"step {work.step}: every-step sync exchanges every step")

    def record_work(self, proof: RoundProof) -> None:
        """With work records, a robust rule's gather keeps what a sum would have been."""
        self.keep_sum = True

    def new_epoch(self, epoch: int) -> None:
        if self.codec is not None:
            self.codec.reset(f"membership epoch {epoch} formed")

    def exchange_step(self, group: EpochGroup, should_cancel: ShouldCancel, work: StepWork,
                      inner_step: InnerStep) -> None:
        ex = self.exchange
        self._summed = None
        if ex.gathers:  # a robust rule needs every worker's gradient
            gathered = group.all_gather(ex.tensors(), should_cancel)
            if self.keep_sum:  # what an all-reduce would have summed, in rank order
                self._summed = [sum(c[:g.numel()] for c in copies)
                                for copies, g in zip(gathered, ex.gradients())]
            ex.combine(gathered, [s / work.global_batch for s in work.shares])
            self._plain_bytes += sum(ring_all_gather_bytes(t.nbytes, group.world)
                                     for t in ex.tensors())
        elif self.codec is None:
            group.all_reduce(ex.tensors(), should_cancel)
            self._plain_bytes += sum(ring_all_reduce_bytes(t.nbytes, group.world)
                                     for t in ex.tensors())
        else:
            summed = self.codec.exchange(ex.flat_gradients(), group, should_cancel)
            tail = ex.scalar_tail()
            sent = [tail.clone(), *ex.other_buffers()]  # never a view handed to gloo
            group.all_reduce(sent, should_cancel)
            tail.copy_(sent[0])
            ex.flat_gradients().copy_(summed)
            self._plain_bytes += sum(ring_all_reduce_bytes(t.nbytes, group.world) for t in sent)

    def agreed_sha256(self, model: torch.nn.Module) -> str | None:
        """The hash of what every replica holds alike, to compare across replicas."""
        return param_sha256(model)

    def summed_sent(self) -> list[torch.Tensor]:
        """After the exchange: the sum of every member's contribution (the gradient
        parts of the buffers, as `GradientExchange.gradients` lays them out)."""
        return self._summed if self._summed is not None else self.exchange.gradients()

    def sent_counts(self) -> dict[str, int]:
        return {}  # no samples count travels beside every-step gradients

    def agreed(self) -> contextlib.AbstractContextManager[None]:
        """A block in which the model holds what every replica agrees on: here, always."""
        return contextlib.nullcontext()

    def checked(self) -> list[torch.Tensor]:
        """What the guard looks at for NaN and Inf."""
        return self.exchange.gradients()

    def apply(self, inner_step: InnerStep) -> None:
        """The step committed with an `apply` verdict."""
        if self.codec is not None:
            self.codec.commit()
        inner_step()

    def skip(self) -> None:
        """The step was discarded, or committed without being applied."""
        if self.codec is not None:
            self.codec.discard()

    def rolled_back(self) -> None:
        """The replica returned to its last good state."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Nothing travels: a codec's residual is dropped at every membership change."""

