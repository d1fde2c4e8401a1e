"""What a worker does with a step once it commits: the user's optimizer on the
exchanged gradients (or a skip, or a rollback, as the guard says), then what
every committed step leaves behind: position, hashes, step log, progress and
checkpoint. `Run` decides *whether* a step commits; this decides what follows."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from shoal.spec.elastic import GuardVerdict, Phase
from shoal.train.sync.exchange import StepScalars
from shoal.train.sync.every_step import StepWork

if TYPE_CHECKING:
    from shoal.train.run import Run

log = logging.getLogger(__name__)


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


class StepCommitter:
    """Applies committed steps for a `Run` and keeps their bookkeeping."""

    def __init__(self, run: Run, grad_clip: float) -> None:
        self._run = run
        self.grad_clip = grad_clip
        self.hash_due = True  # compare full parameter hashes at the next step where replicas agree

    def voted(self, scalars: StepScalars, verdict: GuardVerdict) -> None:
        """A step every member voted to commit, with the verdict they agreed on."""
        run = self._run
        # Every member agrees on the lrs: a worker with an empty share skipped the loop
        # body that sets them.
        for group, lr in zip(run.optimizer.param_groups, scalars.lrs):
            group["lr"] = lr
        run.guard.record(verdict, scalars.mean_loss)
        if verdict is GuardVerdict.apply:
            run.sync.apply(self.inner_step)
        else:
            run.sync.skip()
            self._roll_back_if(verdict)
        self._bookkeeping(scalars.mean_loss, verdict is GuardVerdict.apply)

    def alone(self) -> None:
        """A step with nothing to agree on (a DiLoCo inner step): no exchange, no vote.
        This worker's own guard judges its own loss and gradients, and the step commits
        here alone; replicas differ inside a round anyway. Faults, joins, leaves and new
        shares wait for the next voted step (the round's outer step), where a lost
        member's inner work is counted as dropped: on a 100 ms link the per-step scalar
        all-reduce and vote cost more than the step's compute."""
        run, attempt = self._run, self._run.attempt
        loss = attempt.mean_loss
        verdict, reason = run.guard.judge(loss, run.exchange.gradients())
        if reason:
            log.warning("[epoch %d] step %d, this worker's own: %s (%s)", run.record.epoch,
                        run.step_index, reason, verdict.value)
        run.sync.step_alone(attempt.work(run.step_index), self.inner_step,
                            applied=verdict is GuardVerdict.apply)
        self._roll_back_if(verdict)
        run.proof.committed(run.record.epoch)
        run.progress.reached(run.record.epoch, run.step_index, Phase.stepped)
        self._bookkeeping(loss, verdict is GuardVerdict.apply)

    def inner_step(self) -> None:
        """The user's optimizer on the gradients in the exchange buffers."""
        run = self._run
        run.exchange.install()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(run.exchange.params, self.grad_clip)
        scale = run.balancer.lr_scale  # `linear` policy: world / first world
        saved = [g["lr"] for g in run.optimizer.param_groups]
        for g in run.optimizer.param_groups:
            g["lr"] *= scale
        run.optimizer.step()
        for g, lr in zip(run.optimizer.param_groups, saved):
            g["lr"] = lr

    def _roll_back_if(self, verdict: GuardVerdict) -> None:
        # With no good state kept yet the step is only skipped: under DiLoCo, going back
        # to theta_outer then would pair it with the round's optimizer state, a state no
        # replica ever had (an audit calls it forged).
        if verdict is GuardVerdict.rollback and self._run.replica.roll_back():
            self._run.sync.rolled_back()

    def _bookkeeping(self, loss: float | None, applied: bool) -> None:
        """Position, hashes, log, progress, checkpoint: what every committed step leaves."""
        run = self._run
        run.exchange.clear()
        t_commit = time.time()
        agreed = run.sync.consensus  # under DiLoCo, replicas agree only after outer steps
        run.replica.advance(run.attempt.global_batch, snapshot=applied and agreed)
        check = run.config.replica_check_interval
        self.hash_due = self.hash_due or bool(check and run.step_index % check == 0)
        full_hash = run.sync.agreed_sha256(run.model) if self.hash_due else None
        self.hash_due = self.hash_due and full_hash is None
        run.step_log.write(run, loss if applied else None, applied, t_commit, full_hash)
        if run.rank == 0:
            run.progress.report_progress(run.step_index)
            checkpoints = run.checkpoints
            if checkpoints and run.step_index % run.config.checkpoint_interval == 0:
                checkpoints.save_async(run.replica.snapshot())
