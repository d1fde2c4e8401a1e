"""One attempt at a step: this worker's part of it, filled in by the loop as its
micro-batches run, and read by the commit and the step log once it is decided."""

from __future__ import annotations

from dataclasses import dataclass

from shoal.train.sync.protocol import StepWork


@dataclass
class Attempt:
    """One attempt at a step: this worker's part of it, filled in by the loop."""

    shares: tuple[int, ...]  # every rank's samples, in rank order
    global_batch: int
    share: int  # the samples this worker computes on (its part of `shares`, unless it cheats)
    started: float  # wall clock
    done_samples: int = 0
    chunk: int = 0  # samples of the micro-batch the loop is on (0: none pending)
    loss_sum: float = 0.0
    loss_samples: int = 0
    warmup: bool = False  # a spare's throwaway micro-batch: its gradients are dropped

    @property
    def mean_loss(self) -> float | None:
        """This worker's own mean loss over the samples whose loss the loop reported."""
        return self.loss_sum / self.loss_samples if self.loss_samples else None

    def work(self, step: int) -> StepWork:
        return StepWork(step, self.share, self.shares, self.global_batch)
