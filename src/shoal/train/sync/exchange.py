"""The gradient exchange buffer: what one worker contributes to a step.

Plain `loss.backward()` fills each parameter's `.grad` as in any PyTorch
loop; at every `optimizer.step()` the run folds those gradients into a
flat buffer per dtype, weighted by the micro-batch's part of the global
batch, and clears them. The buffers are what the group all-reduces: one
collective per dtype (a bf16 model exchanges bf16), and the float32 one
carries a tail of step scalars (learning rates, loss, sample counts, each
member's parameter fingerprint) so agreeing on them costs no extra round.

Under a robust aggregation rule the group all-gathers the buffers instead:
every replica sums the scalar tails in rank order and puts the rule's
aggregate where the summed gradients would be, so what reads the buffers
afterwards (guard, optimizer, fingerprints) works the same under any rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from shoal.spec.job import Aggregation
from shoal.train.sync.aggregate import Workspace, aggregate

# Tail of the float32 buffer, after its gradients: per optimizer param group the lr
# of workers that ran the loop body, then these, then two fingerprint slots per rank.
_RAN, _LOSS_SUM, _SAMPLES = range(3)


@dataclass(frozen=True)
class StepScalars:
    """The step's agreed scalars, read from the all-reduced tail."""

    lrs: tuple[float, ...]  # per param group: the mean lr of workers that ran the loop body
    mean_loss: float | None  # global mean loss (None if no worker reported its loss)
    fingerprints: tuple[int, ...]  # one per rank, in rank order


class GradientExchange:
    def __init__(self, params: list[torch.Tensor], groups: int,
                 aggregation: Aggregation = Aggregation.mean) -> None:
        self.aggregation = Aggregation(aggregation)
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.groups = groups  # optimizer param groups (each has its own lr)
        self.dtypes = sorted({p.dtype for p in self.params} | {torch.float32}, key=str)
        self.world = 1
        self.workspace = Workspace()  # the rule's intermediates, reused from step to step
        self.fresh(world=1)

    def fresh(self, world: int) -> None:
        """New buffers (a buffer handed to an abandoned collective is never reused)."""
        self.world = world
        self.buffers: dict[torch.dtype, torch.Tensor] = {}
        self._slices: list[tuple[torch.dtype, int, int]] = []
        sizes: dict[torch.dtype, int] = {d: 0 for d in self.dtypes}
        for p in self.params:
            self._slices.append((p.dtype, sizes[p.dtype], sizes[p.dtype] + p.numel()))
            sizes[p.dtype] += p.numel()
        self._grad_numel = sizes[torch.float32]
        sizes[torch.float32] += self.groups + 3 + 2 * world
        device = self.params[0].device
        for dtype, size in sizes.items():
            if size:
                self.buffers[dtype] = torch.zeros(size, dtype=dtype, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """What the group all-reduces, in an order every member shares."""
        return [self.buffers[d] for d in self.dtypes if d in self.buffers]

    @property
    def gathers(self) -> bool:
        """True when the rule needs every worker's contribution (an all-gather), not a sum."""
        return self.aggregation is not Aggregation.mean

    def combine(self, gathered: list[list[torch.Tensor]], weights: list[float]) -> None:
        """Put the rule's aggregate of `gathered` (per tensor of `tensors()`, one copy per
        rank in rank order) in the buffers, with the scalar tails summed.

        `weights`: each rank's share of the global batch (share / global batch)."""
        for buffer, copies in zip(self.tensors(), gathered):
            if len(copies) != len(weights):
                raise ValueError(f"{len(copies)} contributions for {len(weights)} ranks")
            end = self._grad_numel if buffer.dtype == torch.float32 else buffer.numel()
            aggregate(self.aggregation, [c[:end] for c in copies], weights, self.workspace,
                      out=buffer[:end])
            if end < buffer.numel():
                tail = buffer[end:]
                tail.zero_()
                for c in copies:  # rank order: the same bits on every replica
                    tail += c[end:]

    def fold(self, weight: float) -> None:
        """Add this micro-batch's `.grad`s, times `weight`, to the buffers; clear them."""
        for p, (dtype, start, end) in zip(self.params, self._slices):
            if p.grad is not None:
                self.buffers[dtype][start:end].add_(p.grad.reshape(-1), alpha=weight)
                p.grad = None

    def gradients(self) -> list[torch.Tensor]:
        """The flat gradient part of each buffer (for the guard's finiteness check)."""
        out = []
        for dtype, buffer in self.buffers.items():
            out.append(buffer[: self._grad_numel] if dtype == torch.float32 else buffer)
        return out

    def flat_gradients(self) -> torch.Tensor:
        """The float32 buffer's gradients, as one flat view (what a codec compresses)."""
        return self.buffers[torch.float32][: self._grad_numel]

    def other_buffers(self) -> list[torch.Tensor]:
        """The buffers of dtypes other than float32 (exchanged uncompressed)."""
        return [self.buffers[d] for d in self.dtypes if d in self.buffers and d != torch.float32]

    def scalar_tail(self) -> torch.Tensor:
        """The step scalars after the float32 gradients (a view)."""
        return self._tail()

    def install(self) -> None:
        """Point each parameter's `.grad` at its exchanged slice, for the optimizer."""
        for p, (dtype, start, end) in zip(self.params, self._slices):
            p.grad = self.buffers[dtype][start:end].view_as(p)

    def clear(self) -> None:
        """After the optimizer stepped: zero the buffers, drop the views."""
        for p in self.params:
            p.grad = None
        for buffer in self.buffers.values():
            buffer.zero_()

    def write_scalars(self, rank: int, lrs: list[float], ran: bool, loss_sum: float,
                      samples: int, fingerprint: tuple[int, int]) -> None:
        """`samples`: how many samples `loss_sum` covers (those whose loss the loop reported)."""
        tail = self._tail()
        tail.zero_()
        tail[: self.groups] = torch.tensor([lr if ran else 0.0 for lr in lrs])
        base = self.groups
        tail[base + _RAN], tail[base + _LOSS_SUM], tail[base + _SAMPLES] = float(ran), loss_sum, samples
        # Every other rank writes 0.0 here, so after the sum each slot holds one rank's value.
        slot = base + 3 + 2 * rank
        tail[slot], tail[slot + 1] = float(fingerprint[0]), float(fingerprint[1])

    def read_scalars(self) -> StepScalars:
        tail = self._tail().tolist()
        base = self.groups
        ran = max(1.0, tail[base + _RAN])
        prints = tail[base + 3:]
        return StepScalars(
            lrs=tuple(lr_sum / ran for lr_sum in tail[: self.groups]),
            mean_loss=tail[base + _LOSS_SUM] / tail[base + _SAMPLES] if tail[base + _SAMPLES] else None,
            fingerprints=tuple(int(prints[2 * r]) << 24 | int(prints[2 * r + 1])
                               for r in range(self.world)),
        )

    def declared_lrs(self, tail: tuple[float, ...]) -> tuple[float, ...] | None:
        """The learning rates in one member's own tail (as it wrote it): None if it did
        not run the loop body and added none; anything else unlike a real member's (an
        lr beside `ran = 0`, or a `ran` other than 0 or 1, would skew the mean lr)."""
        if len(tail) <= self.groups + _RAN:
            return (-1.0,)
        ran, lrs = tail[self.groups + _RAN], tuple(tail[: self.groups])
        if ran == 1.0:
            return lrs
        if ran == 0.0 and not any(lrs):
            return None
        return (-1.0, ran, *lrs)  # no learning rate is negative: it never matches a peer's

    def declared_loss(self, tail: tuple[float, ...]) -> tuple[float, float]:
        """The loss report in one member's own tail: (loss sum, samples it covers)."""
        if len(tail) <= self.groups + _SAMPLES:
            return math.nan, math.nan
        return tail[self.groups + _LOSS_SUM], tail[self.groups + _SAMPLES]

    def _tail(self) -> torch.Tensor:
        return self.buffers[torch.float32][self._grad_numel:]
