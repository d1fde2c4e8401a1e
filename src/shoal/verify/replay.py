"""Re-executing one worker's share of one step from its work record: the
same parameters, samples, micro-batch split, weights and seed as the run
used, through the same gradient buffer, so an honest replay differs from
the honest contribution only by floating-point reduction order.

Under DiLoCo a step also moves the worker's own replica: `local_step`
re-takes the job's optimizer step from the state the worker kept, on the
gradient it committed, with the hyperparameters and learning rate of the
job (never the worker's), to see where an honest step ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shoal.spec.proof import WorkRecord
from shoal.train.sync.exchange import GradientExchange
from shoal.train.order import DataOrder

# (model, batch) -> the micro-batch's mean loss, exactly as the job's loop computes it.
LossFunction = Callable[[torch.nn.Module, Any], torch.Tensor]
# sample ids -> batch, as the run's dataset gives it.
FetchBatch = Callable[[np.ndarray], Any]


@dataclass(frozen=True)
class InnerOptimizer:
    """Under DiLoCo, the optimizer each worker steps alone, as the job defines it."""

    build: Callable[[torch.nn.Module], torch.optim.Optimizer]  # the job's, on a model
    lr: Callable[[int], float]  # the learning rate of a step
    grad_clip: float = 0.0  # the job's gradient clipping (0: none)


@dataclass(frozen=True)
class JobSeeds:
    """What the job fixes for every record, never the worker: the data seed (the order
    of the samples) and the micro-batch size; each step's RNG seed derives from the data
    seed, the step and the slice (`work_records.step_rng_seed`)."""

    seed: int
    micro_batch: int | None


class Replayer:
    def __init__(self, model: torch.nn.Module, loss: LossFunction, fetch: FetchBatch,
                 num_samples: int, inner: InnerOptimizer | None = None,
                 seeds: JobSeeds | None = None) -> None:
        """`seeds`: the job's, which a record must state (None: taken from the record,
        for replaying a record whose job is not at hand)."""
        self.model, self.loss, self.fetch = model, loss, fetch
        self.num_samples = num_samples
        self.inner = inner
        self.seeds = seeds
        self._orders: dict[int, DataOrder] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self._stepped = False  # has `local_step` left a state in the optimizer
        self._step_exchange: GradientExchange | None = None  # local_step's gradient buffer
        # The loss report of the last `contribution`: (sum, samples), as a worker's loop
        # reports it to the guard.
        self.loss_sum, self.loss_samples = 0.0, 0

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
        self.loss_sum = 0.0  # what the worker's loop reports to the guard, summed as it does
        if len(ids):
            parts = -(-len(ids) // (record.micro_batch or len(ids)))
            for chunk in np.array_split(ids, parts):
                loss = self.loss(self.model, self.fetch(chunk))
                loss.backward()
                self.loss_sum += float(loss.detach()) * len(chunk)
                exchange.fold(len(chunk) / record.global_batch)
        self.loss_samples = len(ids)
        return [g.clone() for g in exchange.gradients()]

    def fresh_optimizer_state(self) -> dict:
        """The state of the job's optimizer before its first step (a round may start so)."""
        if self.inner is None:
            raise ValueError("this replayer has no inner optimizer (the job is not DiLoCo)")
        return self.inner.build(self.model).state_dict()["state"]

    def local_step(self, record: WorkRecord, params: dict[str, torch.Tensor] | None,
                   optimizer_state: dict | None, gradients: list[torch.Tensor]) -> dict:
        """Where an honest worker's own step ends (DiLoCo): from `params` (None: those
        the model holds) and `optimizer_state` (None: the one the last step here left),
        on `gradients` as committed (weighted by the step's global batch), the job's
        optimizer takes the step as `DiLoCo` does: the mean gradient over the worker's
        samples, clipped, at the step's learning rate. Returns the optimizer's new state
        (its live tensors: the next step here moves them); the model holds the new
        parameters. (A round's end audit re-takes a chain of steps, each from where the
        last ended: there the model and the optimizer hold the start already, and loading
        the state again each step was most of a re-take's cost.)"""
        self._build()
        if params is not None:
            self.model.load_state_dict(params)
        optimizer = self._optimizer
        if optimizer_state is not None:
            optimizer.load_state_dict({"state": optimizer_state, "param_groups": self._groups})
        elif not self._stepped:
            raise ValueError("no optimizer state to go on from: the first step needs one")
        for group in optimizer.param_groups:
            group["lr"] = self.inner.lr(record.step)
        exchange = self._step_exchange
        for view, value in zip(exchange.gradients(), gradients):
            view.copy_(value)
            view.mul_(record.global_batch / record.samples)
        exchange.install()
        if self.inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(exchange.params, self.inner.grad_clip)
        optimizer.step()
        exchange.clear()
        self._stepped = True
        return optimizer.state_dict()["state"]

    def hold(self, params: dict[str, torch.Tensor] | None, optimizer_state: dict) -> None:
        """Put a worker's state in the model (None: it holds it already) and the
        optimizer, for `local_step` to go on from (with None for both) without taking a
        step here."""
        if params is not None:
            self.model.load_state_dict(params)
        self._build()
        self._optimizer.load_state_dict({"state": optimizer_state, "param_groups": self._groups})
        self._stepped = True

    def local_state(self) -> dict:
        """The optimizer state the last `local_step` (or `hold`) left, live."""
        if not self._stepped:
            raise ValueError("no local step was taken here yet")
        return self._optimizer.state_dict()["state"]

    def _build(self) -> None:
        if self.inner is None:
            raise ValueError("this replayer has no inner optimizer (the job is not DiLoCo)")
        if self._optimizer is None:  # one, on this model, with the job's hyperparameters
            self._optimizer = self.inner.build(self.model)
            self._groups = self._optimizer.state_dict()["param_groups"]
            self._step_exchange = GradientExchange(list(self.model.parameters()), groups=1)

    def flat_params(self) -> torch.Tensor:
        """The trainable parameters as one flat vector (DiLoCo's order)."""
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()
                              if p.requires_grad])


def relative_distance(replayed: list[torch.Tensor], revealed: list[torch.Tensor]) -> float:
    """||replayed − revealed|| / ||replayed|| (in float64); inf if the shapes differ.

    Where the replay itself is not finite (a state whose loss overflows: every honest
    worker sends NaN there too) the contribution must be non-finite at exactly those
    entries, and is compared on the others."""
    if len(replayed) != len(revealed) or any(a.shape != b.shape for a, b in zip(replayed, revealed)):
        return float("inf")
    diff = norm = 0.0
    for a, b in zip(replayed, revealed):
        a, b = a.double(), b.double()
        finite = torch.isfinite(a)
        if not torch.equal(finite, torch.isfinite(b)):
            return float("inf")
        if not bool(finite.all()):
            a, b = a[finite], b[finite]
        diff += float(((a - b) ** 2).sum())
        norm += float((a ** 2).sum())
    if norm == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return (diff / norm) ** 0.5
