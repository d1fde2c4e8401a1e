"""Re-executing one worker's share of one step from its work record: the
same parameters, samples, micro-batch split, weights and seed as the run
used, through the same gradient buffer, so an honest replay differs from
the honest contribution only by floating-point reduction order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shoal.spec.proof import WorkRecord
from shoal.train.exchange import GradientExchange
from shoal.train.order import DataOrder

# (model, batch) -> the micro-batch's mean loss, exactly as the job's loop computes it.
LossFunction = Callable[[torch.nn.Module, Any], torch.Tensor]
# sample ids -> batch, as the run's dataset gives it.
FetchBatch = Callable[[np.ndarray], Any]


class Replayer:
    def __init__(self, model: torch.nn.Module, loss: LossFunction, fetch: FetchBatch,
                 num_samples: int) -> None:
        self.model, self.loss, self.fetch = model, loss, fetch
        self.num_samples = num_samples
        self._orders: dict[int, DataOrder] = {}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Set the parameters a step started from (a snapshot from the proof store)."""
        self.model.load_state_dict(state)

    def contribution(self, record: WorkRecord) -> list[torch.Tensor]:
        """What an honest worker would have sent for `record` from the loaded state."""
        order = self._orders.setdefault(record.seed, DataOrder(self.num_samples, record.seed))
        ids = order.sample_ids(range(record.positions_start, record.positions_end))
        exchange = GradientExchange(list(self.model.parameters()), groups=1)
        self.model.zero_grad(set_to_none=True)
        torch.manual_seed(record.rng_seed)
        if len(ids):
            parts = -(-len(ids) // (record.micro_batch or len(ids)))
            for chunk in np.array_split(ids, parts):
                self.loss(self.model, self.fetch(chunk)).backward()
                exchange.fold(len(chunk) / record.global_batch)
        return [g.clone() for g in exchange.gradients()]


def relative_distance(replayed: list[torch.Tensor], revealed: list[torch.Tensor]) -> float:
    """||replayed − revealed|| / ||replayed|| (in float64); inf if the shapes differ."""
    if len(replayed) != len(revealed) or any(a.shape != b.shape for a, b in zip(replayed, revealed)):
        return float("inf")
    diff = sum(float(((a.double() - b.double()) ** 2).sum()) for a, b in zip(replayed, revealed))
    norm = sum(float((a.double() ** 2).sum()) for a in replayed)
    if norm == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return (diff / norm) ** 0.5
