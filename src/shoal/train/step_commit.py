"""What a worker does with a step once it commits: the user's optimizer on the
exchanged gradients (or a skip, or a rollback, as the guard says), then what
every committed step leaves behind: position, hashes, step log, progress and
checkpoint. `Run` decides *whether* a step commits; this decides what follows."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shoal.spec.elastic import GuardVerdict, Phase
from shoal.train.attempt import Attempt
from shoal.train.checkpoint import CheckpointStore
from shoal.train.guard import StepGuard
from shoal.train.hooks import StepHook
from shoal.train.liveness import ProgressReporter
from shoal.train.member import Membership
from shoal.train.replica import ReplicaState
from shoal.train.run_config import RunConfig
from shoal.train.shares import ShareBalancer
from shoal.train.step_log import StepLog
from shoal.train.sync.exchange import GradientExchange, StepScalars
from shoal.train.sync.protocol import Sync

log = logging.getLogger(__name__)


@dataclass(eq=False)
class StepCommitter:
    """Applies a run's committed steps and keeps their bookkeeping; its collaborators
    are the run's own, handed over once the run is wrapped."""

    config: RunConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    exchange: GradientExchange
    sync: Sync
    guard: StepGuard
    balancer: ShareBalancer
    replica: ReplicaState
    membership: Membership
    progress: ProgressReporter
    checkpoints: CheckpointStore | None
    step_log: StepLog
    hook: StepHook
    grad_clip: float = 0.0
    hash_due: bool = True  # compare full parameter hashes at the next step where replicas agree
    # The step just committed rolled back to the state this step started from (its work
    # record says so, and must end there), or None.
    rolled_back_to: int | None = None
    # After every committed step, applied or not (the run's schedulers: one schedule step
    # per job step, so a joiner handed the state follows the same schedule).
    on_commit: Callable[[], None] = lambda: None

    def voted(self, attempt: Attempt, scalars: StepScalars, verdict: GuardVerdict) -> None:
        """A step every member voted to commit, with the verdict they agreed on."""
        # Every member agrees on the lrs: a worker with an empty share skipped the loop
        # body that sets them.
        for group, lr in zip(self.optimizer.param_groups, scalars.lrs):
            group["lr"] = lr
        self.guard.record(verdict, scalars.mean_loss)
        self.rolled_back_to = None
        if verdict is GuardVerdict.apply:
            self.sync.apply(self.inner_step)
        else:
            self.sync.skip()
            self._roll_back_if(verdict)
        self._bookkeeping(attempt, scalars.mean_loss, verdict is GuardVerdict.apply)

    def alone(self, attempt: Attempt) -> None:
        """A step with nothing to agree on (a DiLoCo inner step): no exchange, no vote.
        This worker's own guard judges its own loss and gradients, and the step commits
        here alone; replicas differ inside a round anyway. Faults, joins, leaves and new
        shares wait for the next voted step (the round's outer step), where a lost
        member's inner work is counted as dropped: on a 100 ms link the per-step scalar
        all-reduce and vote cost more than the step's compute."""
        epoch, step = self.membership.record.epoch, self.replica.step
        loss = attempt.mean_loss
        verdict, reason = self.guard.judge(loss, self.exchange.gradients())
        if reason:
            log.warning("[epoch %d] step %d, this worker's own: %s (%s)", epoch, step, reason,
                        verdict.value)
        self.sync.step_alone(attempt.work(step), self.inner_step,
                             applied=verdict is GuardVerdict.apply)
        self.rolled_back_to = None
        self._roll_back_if(verdict)
        self.hook.committed(epoch, self.rolled_back_to)
        self.progress.reached(epoch, self.replica.step, Phase.stepped)  # after any rollback
        self._bookkeeping(attempt, loss, verdict is GuardVerdict.apply)

    def inner_step(self) -> None:
        """The user's optimizer on the gradients in the exchange buffers."""
        self.exchange.install()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.exchange.params, self.grad_clip)
        scale = self.balancer.lr_scale  # `linear` policy: world / first world
        saved = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] *= scale
        self.optimizer.step()
        for g, lr in zip(self.optimizer.param_groups, saved):
            g["lr"] = lr

    def _roll_back_if(self, verdict: GuardVerdict) -> None:
        # With no good state kept yet the step is only skipped: under DiLoCo, going back
        # to theta_outer then would pair it with the round's optimizer state, a state no
        # replica ever had (an audit calls it forged).
        if verdict is GuardVerdict.rollback and self.replica.roll_back():
            self.rolled_back_to = self.replica.last_good_step
            self.sync.rolled_back()

    def _bookkeeping(self, attempt: Attempt, loss: float | None, applied: bool) -> None:
        """Position, hashes, log, progress, checkpoint: what every committed step leaves."""
        self.exchange.clear()
        t_commit = time.time()
        agreed = self.sync.consensus  # under DiLoCo, replicas agree only after outer steps
        self.replica.advance(attempt.global_batch, snapshot=applied and agreed)
        self.on_commit()
        step = self.replica.step
        check = self.config.settings.replica_check_interval
        self.hash_due = self.hash_due or bool(check and step % check == 0)
        full_hash = self.sync.agreed_sha256(self.model) if self.hash_due else None
        self.hash_due = self.hash_due and full_hash is None
        self.step_log.write(step - 1, self.replica.cursor - attempt.global_batch, self.membership,
                            attempt, self.sync, loss if applied else None, applied, t_commit,
                            full_hash)
        if self.membership.rank == 0:
            self.progress.report_progress(step)
            if self.checkpoints and step % self.config.settings.checkpoint_interval == 0:
                self.checkpoints.save_async(self.replica.snapshot())
