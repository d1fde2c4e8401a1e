"""The run's proof hooks at each step (`shoal.train.hooks.StepHook`): an adversary
(if this worker is told to cheat) and the work recorder (if the job records work),
applied at the three points where a worker's claim is made: which samples it
computes on, what it sends, and what it publishes once the step commits.

An honest worker that records nothing pays nothing here.
"""

from __future__ import annotations

import numpy as np
import torch

from shoal.train.errors import TrainError
from shoal.train.group import EpochGroup, ShouldCancel
from shoal.train.hashing import param_sha256
from shoal.train.sync.exchange import GradientExchange
from shoal.train.sync.protocol import Sync
from shoal.verify.adversary import Adversary, AdversaryContext
from shoal.verify.sent_check import Checked, Sent, SentCheck
from shoal.verify.work_records import LocalSteps, ProofSettings, WorkRecorder


class StepProof:
    def __init__(self, worker: str, adversary: Adversary | None,
                 settings: ProofSettings | None = None) -> None:
        """`settings`: the job records work (its `[proof]`); None: it does not."""
        self.worker = worker
        self.adversary = adversary
        self.settings = settings
        self.recorder: WorkRecorder | None = None
        self._memory: dict = {}
        self._context: AdversaryContext | None = None
        self._model: torch.nn.Module | None = None
        self.sent_check: SentCheck | None = None  # set when the job records work
        self._declared: list[torch.Tensor] | None = None
        self._sync: Sync | None = None  # the run's, once it is wrapped

    def attach(self, sync: Sync, exchange: GradientExchange,
               optimizer: torch.optim.Optimizer) -> None:
        """The run was wrapped with `sync`: a cheat that needs local rounds refuses a
        mode without them, and a job that records work starts its recorder."""
        self._sync = sync
        if self.adversary is not None and self.adversary.diloco_only and not sync.local_steps:
            raise TrainError(f"adversary {self.adversary.name!r} cheats under DiLoCo only: "
                             "use it with [sync] mode = 'diloco'")
        if self.settings is not None:
            self.record(WorkRecorder(self.settings, self.worker), sync, exchange, optimizer)

    def record(self, recorder: WorkRecorder, sync: Sync, exchange: GradientExchange,
               optimizer: torch.optim.Optimizer) -> None:
        """The job records work: every step gets a record, and every voted step's
        members declare what they sent, against the sum (`shoal.verify.sent_check`)."""
        self.recorder = recorder
        self.sent_check = SentCheck(exchange.declared_lrs, exchange.declared_loss)
        sync.record_work(self)
        if sync.local_steps:  # each worker steps alone inside a round
            recorder.local = LocalSteps(optimizer, sync.round_begins_at)

    @property
    def diloco(self) -> bool:
        """Workers step alone inside rounds; only a round's end is exchanged."""
        return self._sync is not None and self._sync.local_steps

    @property
    def active(self) -> bool:
        return self.adversary is not None or self.recorder is not None

    def begin(self, step: int, rank: int, model: torch.nn.Module, positions: range,
              shares: tuple[int, ...], ids: np.ndarray, num_samples: int) -> np.ndarray:
        """At a step's start; returns the sample ids this worker will compute on."""
        self._model = model
        self._context = AdversaryContext(
            worker=self.worker, step=step, rank=rank, world=len(shares), num_samples=num_samples,
            params=[p for p in model.parameters() if p.requires_grad], memory=self._memory,
            peer_record=self.recorder.peer_record if self.recorder else lambda: None,
            round_end=self._sync.votes(step) if self.diloco else None)
        if self.recorder is not None:
            # Dropout and any other randomness of the step: the job's, not the worker's.
            torch.manual_seed(self.recorder.begin(step, model, positions, rank, shares))
        return self.adversary.samples(ids, self._context) if self.adversary else ids

    def before_exchange(self, exchange: GradientExchange) -> None:
        """Swap in what a cheat sends instead, and commit to what is sent (a cheat may
        still put something else in the exchange)."""
        views = exchange.gradients()
        self._declared = None
        if self.adversary is not None:
            with torch.no_grad():
                sent = self.adversary.contribution([v.clone() for v in views], self._context)
                for view, value in zip(views, sent):
                    view.copy_(value)
        if self.recorder is not None:
            self.recorder.seal(views)
        if self.adversary is not None and not self.diloco:  # DiLoCo's inner steps send nothing
            with torch.no_grad():
                wire = self.adversary.sent([v.clone() for v in views], self._context)
                for view, value in zip(views, wire):
                    view.copy_(value)
                if self.adversary.declares_sent:
                    self._declared = [v.clone() for v in views]

    def local_stepped(self, applied: bool) -> None:
        """Under DiLoCo: this worker's own optimizer update of the step is done (or not
        taken): the record claims where it ended."""
        if self.recorder is not None and self.recorder.local is not None \
                and self._model is not None:
            self.recorder.local_stepped(self._model, applied)

    def outer(self, pseudo_gradient: torch.Tensor, round_samples: int,
              round_expected: int) -> torch.Tensor:
        """Under DiLoCo, at a round's last step: what this worker sends as its weighted
        pseudo-gradient (a cheat's, if it cheats there), committed in the step's record."""
        if self.adversary is not None and self._context is not None:
            with torch.no_grad():
                pseudo_gradient = self.adversary.pseudo_gradient(pseudo_gradient.clone(),
                                                                 self._context)
        if self.recorder is not None and self.recorder.local is not None:
            self.recorder.outer(pseudo_gradient, round_samples, round_expected)
        if self.adversary is not None and self._context is not None:
            with torch.no_grad():
                pseudo_gradient = self.adversary.sent_pseudo_gradient(pseudo_gradient.clone(),
                                                                      self._context)
            if self.adversary.declares_sent:
                self._declared = [pseudo_gradient]
        return pseudo_gradient

    def reported_loss(self, loss_sum: float) -> float:
        """The loss sum this worker reports for the guard (a cheat's, if it lies)."""
        if self.adversary is None or self._context is None:
            return loss_sum
        return self.adversary.reported_loss(loss_sum, self._context)

    def sent_count(self, count: int) -> int:
        """Under DiLoCo: the samples count sent beside the pseudo-gradient."""
        if self.adversary is None or self._context is None:
            return count
        return self.adversary.sent_count(count, self._context)

    @property
    def checks_sent(self) -> bool:
        return self.sent_check is not None and self.recorder is not None

    def check_sent(self, group: EpochGroup, sync: Sync, tail: tuple[float, ...],
                   summed_tail: tuple[float, ...], should_cancel: ShouldCancel) -> Checked:
        """After a voted step's exchange: declare what this worker committed to sending
        (a cheat declaring what it really sent: that) and check every member's
        declarations against the sum (`shoal.verify.sent_check`). `tail`: the step
        scalars this worker added; `summed_tail`: everyone's, exchanged."""
        assert self.sent_check is not None and self.recorder is not None
        mine = self._declared if self._declared is not None else self.recorder.sent_part()
        checked = self.sent_check.check(group, Sent(
            mine, sync.summed_sent(), tail, summed_tail, **sync.sent_counts()), should_cancel)
        self.recorder.exchanged(checked.exchanged)
        return checked

    def hopeless(self, members: tuple[str, ...]) -> str | None:
        """Why the run cannot go on: members whose declarations never add up."""
        return self.sent_check.hopeless(members) if self.sent_check is not None else None

    def committed(self, membership_epoch: int = 0, rolled_back_to: int | None = None) -> None:
        """The step committed everywhere (in `membership_epoch`) and was applied, skipped, or
        rolled back to the state step `rolled_back_to` started from: publish its record,
        with where the step ended, and keep its contribution."""
        pending = self.recorder.pending if self.recorder is not None else None
        if pending is None or self._model is None:
            return
        record, sent = pending
        record = record.model_copy(update={"membership_epoch": membership_epoch,
                                           "end_sha256": param_sha256(self._model),
                                           "rolled_back_to": rolled_back_to})
        if self.adversary is not None:
            record = self.adversary.record(record, self._context)
            sent = self.adversary.reveal(sent, self._context)
            if record is None:  # it files nothing: its share is audited without a record
                return
        self.recorder.publish(record, sent)
