"""The elastic training API: a few lines around a plain PyTorch loop.

    run = shoal.join()
    model, optimizer = run.wrap(model, optimizer)
    for batch in run.batches(dataset, global_batch=256, steps=1000):
        loss = model_loss(model, batch)
        loss.backward()            # or run.backward(loss), which also reports the loss
        optimizer.step()

`batches` yields this worker's share of each step (in micro-batches);
`optimizer.step()` folds the micro-batch's gradients into the exchange and,
when the share is done, exchanges them, commits or discards the step with
every other worker (under DiLoCo, only a round's outer step is exchanged and
voted on; an inner step commits alone), and re-forms the group when
membership changes. Faults never reach the loop: a failed step is redone,
with the same samples, by whoever is left.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from shoal.spec.bundle import JOB_GLOBAL_BATCH_ENV, JOB_STEPS_ENV
from shoal.spec.elastic import BatchPolicy, GuardVerdict, Phase, StepBallot
from shoal.spec.job import Aggregation, SyncSpec
from shoal.train.attempt import Attempt
from shoal.train.checkpoint import CheckpointStore
from shoal.train.commit import agree
from shoal.train.errors import TrainError
from shoal.train.sync.exchange import GradientExchange, StepScalars
from shoal.train.group import GroupCancelled, GroupFailed
from shoal.train.guard import StepGuard
from shoal.train.hashing import param_sha256
from shoal.train.hooks import NoStepHook, StepHook
from shoal.train.inject import InjectedFaults
from shoal.train.liveness import ProgressReporter
from shoal.train.member import Membership
from shoal.train.order import DataOrder, share_positions
from shoal.train.rendezvous import Rendezvous, connect
from shoal.train.replica import ReplicaState
from shoal.train.schedules import HeldState
from shoal.train.run_config import RunConfig
from shoal.train.shares import ShareBalancer
from shoal.train.step_commit import StepCommitter
from shoal.train.step_log import StepLog
from shoal.train.sync.modes import make_sync
from shoal.train.sync.protocol import Sync

log = logging.getLogger(__name__)


class ElasticOptimizer(torch.optim.Optimizer):
    """The user's optimizer, stepped only by the run when a step commits.

    An `Optimizer` to whoever checks (a torch or transformers scheduler built on it
    refuses anything else), whose parameter groups and state are the inner one's:
    `Optimizer.__init__` is not run, as this holds no parameters of its own.
    """

    def __init__(self, run: Run, inner: torch.optim.Optimizer) -> None:  # noqa: D107
        self._run, self.inner = run, inner

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.inner.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.inner.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.defaults

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.inner.load_state_dict(state_dict)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self._run.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        # `.grad` holds only the current micro-batch (the run folds it away at step()).
        self.inner.zero_grad(set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"ElasticOptimizer({self.inner!r})"


class Run:
    def __init__(self, config: RunConfig, hook: StepHook,
                 faults: InjectedFaults = InjectedFaults()) -> None:
        self.config = config
        self.faults = faults  # what this worker is told to break (tests, rehearsals)
        self.worker = config.worker
        self.rdzv = Rendezvous(connect(config.host, config.port))
        self.left = False  # this worker handed over and left (SIGTERM)
        self._votes = 0  # voted steps of this epoch so far: the next ballot's index
        settings = config.settings
        self.balancer = ShareBalancer(config.worker, settings.rebalance_interval,
                                      settings.speed_report_interval, settings.slowdown)
        self.guard = StepGuard(settings.guard)
        self.held = HeldState()  # the user's schedulers and kept objects
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.replica: ReplicaState | None = None
        self.attempt: Attempt | None = None  # the step being computed
        self._final: dict[str, object] | None = None
        self.checkpoints = (CheckpointStore(settings.checkpoint_dir, settings.identity,
                                            settings.checkpoint_keep)
                            if settings.checkpoint_dir else None)
        self.step_log = StepLog(config.run_dir, self.worker)
        self.progress = ProgressReporter(self.worker, self._connect)
        self.membership = Membership(config, self.rdzv, self.progress, faults)
        self.hook = hook  # proof of learning's calls at each step (`shoal.train.hooks`)
        signal.signal(signal.SIGTERM, lambda *_: self.membership.leave_wanted.set())

    def _connect(self) -> Rendezvous:
        return Rendezvous(connect(self.config.host, self.config.port))

    # The replica's position, held by its ReplicaState (what a peer sends a joiner).
    step_index = property(lambda self: self.replica.step if self.replica else 0)
    cursor = property(lambda self: self.replica.cursor if self.replica else 0)
    # This worker's place in the current epoch (they change per epoch).
    record = property(lambda self: self.membership.record)
    group = property(lambda self: self.membership.group)
    rank = property(lambda self: self.membership.placed().rank)
    world = property(lambda self: self.membership.placed().world)

    # -- the user's side --------------------------------------------------

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             grad_clip: float = 0.0,
             aggregation: Aggregation = Aggregation.mean,
             sync: SyncSpec | None = None,
             scheduler: Any = None) -> tuple[torch.nn.Module, ElasticOptimizer]:
        """`aggregation`: how the workers' contributions combine (the job file's rule);
        `sync`: every-step all-reduce or DiLoCo, and the codec (the job's [sync]);
        `scheduler`: a learning-rate scheduler built on `optimizer`, which the run then
        steps (see `schedule`)."""
        self.model, self.optimizer = model, optimizer
        self.aggregation = Aggregation(aggregation)
        self.exchange = GradientExchange(list(model.parameters()), len(optimizer.param_groups),
                                         self.aggregation)
        self.sync: Sync = make_sync(sync, self.exchange, optimizer,
                                    self.faults.exchange_delay_s)
        self.replica = ReplicaState(model, optimizer, self.guard, self.balancer, self.checkpoints)
        self.replica.extras["sync"] = self.sync
        self.replica.extras["held"] = self.held
        self.committer = StepCommitter(
            self.config, model, optimizer, self.exchange, self.sync, self.guard, self.balancer,
            self.replica, self.membership, self.progress, self.checkpoints, self.step_log,
            self.hook, grad_clip)
        self.committer.on_commit = self.held.committed
        self.hook.attach(self.sync, self.exchange, optimizer)
        self.elastic_optimizer = ElasticOptimizer(self, optimizer)
        if scheduler is not None:
            self.schedule(scheduler)
        return model, self.elastic_optimizer

    def schedule(self, scheduler: Any) -> Any:
        """Step `scheduler` (a torch or transformers learning-rate scheduler) once per
        committed step, on every member alike, and carry its state to joiners and into
        checkpoints; the loop's own `scheduler.step()` then does nothing. Returns it.

        A scheduler stepped by the loop alone would be stepped once per batch a worker
        saw (never on an empty share) and from zero on a joiner: each member would follow
        its own schedule."""
        self.held.schedule(scheduler)
        return scheduler

    def keep(self, name: str, holder: Any) -> Any:
        """Carry `holder`'s state (state_dict / load_state_dict: an EMA of the weights, a
        GradScaler) to joiners and into checkpoints, like the model's. Returns it."""
        self.held.keep(name, holder)
        return holder

    def batches(self, dataset: Any, global_batch: int, steps: int, *, seed: int = 0,
                micro_batch: int | None = None,
                policy: BatchPolicy = BatchPolicy.invariant) -> Iterator[Any]:
        """This worker's share of every step, in micro-batches, until `steps` commit."""
        if self.model is None:
            raise TrainError("call run.wrap(model, optimizer) before run.batches(...)")
        _hold_to_the_job(steps, global_batch)
        self.held.check_optimizer(self.optimizer, self.elastic_optimizer)
        order = DataOrder(_num_samples(dataset), seed)
        self.sync.plan(steps)
        if self.config.spare and self.config.settings.spare_warmup and self.record is None:
            yield from self._warm_up(dataset, order, global_batch, micro_batch)
        while self._enter_membership():
            if self.step_index >= steps:
                break
            if self.membership.leave_wanted.is_set() and self.world == 1:
                self._last_one_leaves()
                break
            shares = self.balancer.shares(global_batch, self.world, policy)
            positions = share_positions(self.cursor, shares, self.rank)
            ids = order.sample_ids(positions)
            if self.hook.active:
                ids = self.hook.begin(self.step_index, self.rank, self.model, positions, shares,
                                       ids, order.num_samples)
            self.attempt = Attempt(shares, global_batch=sum(shares), share=len(ids),
                                   started=time.time())
            self.faults.before_step(self.step_index, self.exchange.params)
            if len(ids) == 0:
                self._finish_step()
                continue
            for chunk in np.array_split(ids, -(-len(ids) // (micro_batch or len(ids)))):
                self.attempt.chunk = len(chunk)
                yield _fetch(dataset, chunk)
                if self.attempt.chunk:  # the loop must call optimizer.step() after each batch
                    raise TrainError("call optimizer.step() (or run.step()) once per batch")
        self._finish(steps)

    def _warm_up(self, dataset: Any, order: DataOrder, global_batch: int,
                 micro_batch: int | None) -> Iterator[Any]:
        """A warm spare's throwaway micro-batch, before it waits to be called in: the
        loop's forward and backward run once (kernels chosen, buffers first touched),
        the gradients are dropped and nothing steps. Without it, measured on host-kill
        faults, a spare's first three steps took 0.29, 0.19 and 0.16 s against its peers'
        0.10-0.14; with it, one step of 0.16-0.19 s (the new group's first collectives
        in it). Its size: the share it would get joining the newest epoch."""
        latest = self.rdzv.latest_epoch()
        record = self.rdzv.epoch(latest) if latest >= 0 else None
        world = (len(record.members) if record is not None else 0) + 1
        size = min(micro_batch or global_batch, -(-global_batch // world))
        ids = order.sample_ids(range(size))
        self.attempt = Attempt((size,), global_batch=size, share=size, started=time.time(),
                               chunk=size, warmup=True)
        started = time.perf_counter()
        yield _fetch(dataset, ids)
        if self.attempt.chunk:
            raise TrainError("call optimizer.step() (or run.step()) once per batch")
        log.info("[worker %s] warm spare: a throwaway micro-batch of %d took %.2f s", self.worker,
                 size, time.perf_counter() - started)

    def backward(self, loss: torch.Tensor) -> None:
        """`loss.backward()` on a micro-batch's mean loss, and report the loss to the guard."""
        if self.faults.loss_is_nan(self.step_index):
            loss = loss * float("nan")
        loss.backward()
        self.attempt.loss_sum += float(loss.detach()) * self.attempt.chunk
        self.attempt.loss_samples += self.attempt.chunk

    def step(self) -> None:
        """Fold this micro-batch's gradients in (weighted by its part of the global
        batch); when the share is done, exchange and commit the step."""
        attempt = self.attempt
        if attempt.warmup:  # nothing of it is kept
            for p in self.exchange.params:
                p.grad = None
            attempt.chunk = 0
            return
        self.exchange.fold(attempt.chunk / attempt.global_batch)
        attempt.done_samples += attempt.chunk
        attempt.chunk = 0
        if attempt.done_samples >= attempt.share:
            self._finish_step()

    # -- one step ----------------------------------------------------------

    def _finish_step(self) -> None:
        attempt = self.attempt
        self.balancer.after_compute(self.progress, attempt.share, attempt.started, self.step_index)
        self.membership.post_leave()  # a spot notice takes effect at the next voted step
        if self.hook.active:
            self.hook.before_exchange(self.exchange)
        if not self.sync.votes(self.step_index):
            self.committer.alone(attempt)
            return
        self.exchange.write_scalars(
            self.rank, [float(g["lr"]) for g in self.optimizer.param_groups], attempt.share > 0,
            self.hook.reported_loss(attempt.loss_sum), attempt.loss_samples,
            self.sync.fingerprint())
        tail = tuple(self.exchange.scalar_tail().tolist()) if self.hook.checks_sent else ()
        self.progress.reached(self.record.epoch, self.step_index, Phase.exchange)
        ballot, scalars = self._exchange(tail)
        self.progress.reached(self.record.epoch, self.step_index, Phase.voted)
        decision = agree(self.rdzv, self.record, self.worker, self._votes, ballot,
                         waiting=self.progress.waiting)
        self._votes += 1
        if decision.commit:
            applying = time.time()
            self.committer.voted(attempt, scalars, decision.verdict)
            self.balancer.after_apply(time.time() - applying)
            # Once applied: the step's record commits where it ended, which the next
            # step's must start from.
            self.hook.committed(self.record.epoch, self.committer.rolled_back_to)
            if decision.weights:
                self.balancer.weights = decision.weights
        else:
            # Undo what the exchange did here (a DiLoCo outer step took its inner step,
            # and left `.grad` viewing the old buffers: the next backward would add to
            # them, and the redone step would carry this one's gradient). A member
            # dropped meanwhile (fenced while stalled) finds itself outside the next
            # epoch and rejoins with fresh state.
            if decision.resync_from:
                log.warning("[epoch %d] replicas differ at step %d; all adopt %s's state",
                            self.record.epoch, self.step_index, decision.resync_from)
            self.sync.skip()
            self.exchange.fresh(self.world)  # a buffer handed to a failed collective is never reused
        if not decision.commit or decision.next_epoch is not None:
            self._drop_group(stale=False)

    def _withhold(self, step: int) -> None:
        """The injected `withhold` fault: stay out of the exchange, beating as if waiting in
        it, until the peers' collective has timed out (or a newer epoch drops a member)."""
        log.warning("injected fault: withholding step %d's exchange", step)
        settings = self.config.settings
        until = time.monotonic() + settings.collective_timeout_s + 1.0
        while time.monotonic() < until and not self.membership.changed():
            time.sleep(settings.poll_s)

    def _exchange(self, tail: tuple[float, ...]) -> tuple[StepBallot, StepScalars | None]:
        """Exchange the step (shoal.train.sync.every_step: all-reduce, a robust rule's all-gather, a
        codec, or DiLoCo), then this member's ballot: did it work, what does the guard
        say, do the replicas' fingerprints agree. With work records, every member also
        declares what it sent, and a step whose declarations do not add up is refused.

        `tail`: the step scalars this member added (with work records only)."""
        e, step = self.record.epoch, self.step_index
        if self.faults.withholds(step):
            self._withhold(step)
        try:
            self.sync.exchange_step(self.group, self.membership.changed,
                                    self.attempt.work(step), self.committer.inner_step)
        except (GroupFailed, GroupCancelled) as error:
            log.info("[epoch %d rank %d] step %d exchange failed: %s", e, self.rank, step, error)
            return StepBallot(step=step, ok=False), None
        scalars = self.exchange.read_scalars()
        verdict, reason = self.guard.assess(scalars.mean_loss, self.sync.checked())
        if self.hook.checks_sent:
            checked = self.hook.check_sent(self.group, self.sync, tail,
                                            tuple(self.exchange.scalar_tail().tolist()),
                                            self.membership.changed)
            if not checked.ok:
                return StepBallot(step=step, ok=False), None
            if checked.refusal and verdict is GuardVerdict.apply:
                verdict, reason = GuardVerdict.skip, checked.refusal
            hopeless = self.hook.hopeless(self.record.members)
            if hopeless:
                log.error("[worker %s] giving the run up: %s", self.worker, hopeless)
                self.rdzv.mark_failed(hopeless)
                self.rdzv.check_failed()  # raises RunFailed, as every member will
        if reason:
            log.warning("[epoch %d] step %d: %s (%s)", self.record.epoch, self.step_index,
                        reason, verdict.value)
        rebalance = self.balancer.rebalance_due(step, self.sync.steps_per_vote)
        return StepBallot(step=step, ok=True, verdict=verdict,
                          fingerprint=scalars.fingerprints[self.rank], rebalance=rebalance), scalars

    # -- membership ---------------------------------------------------------

    def _enter_membership(self) -> bool:
        """Block until this worker is in a formed epoch; False once it has left."""
        if self.group is not None:
            return True
        if not self.membership.enter(self.replica):
            self.left = True
            return False
        self.balancer.enter_epoch(self.record.weights)
        self._votes = 0  # voted steps of this epoch so far: the next ballot's index
        self.balancer.base_world = self.balancer.base_world or self.world
        self.exchange.fresh(self.world)
        self.sync.new_epoch(self.record.epoch)
        self.committer.hash_due = True
        return True

    def _drop_group(self, stale: bool) -> None:
        self.membership.drop_group()
        if stale:
            self.replica.held = False
            self.exchange.fresh(self.world)

    # -- the end ---------------------------------------------------------------

    def _last_one_leaves(self) -> None:
        """No peer to hand over to: leave the state on disk for whoever comes next."""
        if self.checkpoints is not None:
            self.checkpoints.save_async(self.replica.snapshot())
            self.checkpoints.wait()
            log.warning("[worker %s] last worker leaving: checkpoint of step %d written",
                        self.worker, self.step_index)
        else:
            log.warning("[worker %s] last worker leaving with no checkpoint directory: "
                        "step %d is lost", self.worker, self.step_index)
        self.rdzv.request_leave(self.worker)
        self.left = True

    def _finish(self, steps: int) -> None:
        if self.group is not None and self.step_index >= steps and not self.left:
            if self.checkpoints is not None and self.rank == 0:
                self.checkpoints.save_async(self.replica.snapshot())
            final = {"steps": self.step_index, "param_sha256": param_sha256(self.model)}
            self._final = final if self.rank == 0 else None  # rank 0 reports the job's figures
            # Every member says it finished: the authority ends the job once all have (and
            # with any of them, if rank 0 is lost at the very end).
            self.rdzv.report_final(self.worker, final)
            self.progress.reached(self.record.epoch, self.step_index, Phase.finished)
        if self.checkpoints is not None:
            self.checkpoints.close()
        self.step_log.close()
        self.progress.stop()
        self.membership.drop_group()
        log.info("[worker %s] %s at step %d", self.worker,
                 "left" if self.left else "finished", self.step_index)

    @property
    def is_reporter(self) -> bool:
        """True on the one worker that reports the job's final figures (rank 0 at the end)."""
        return self._final is not None

    def publish_final(self, **figures: object) -> None:
        """Add figures (e.g. val_loss) to the job's final report; only the reporter's count."""
        if self._final is not None:
            self._final.update(figures)
            self.rdzv.report_final(self.worker, self._final)


def _num_samples(dataset: Any) -> int:
    count = getattr(dataset, "num_samples", None)
    count = count() if callable(count) else count
    return int(count if count is not None else len(dataset))


def _hold_to_the_job(steps: int, global_batch: int) -> None:
    """A bundled market job's loop runs the steps and batch its job was submitted with:
    its host ends the job at those steps, and the market priced it for that batch."""
    for name, value, given in ((JOB_STEPS_ENV, steps, "steps"),
                               (JOB_GLOBAL_BATCH_ENV, global_batch, "global_batch")):
        job = os.environ.get(name)
        if job is not None and int(job) != value:
            raise TrainError(f"run.batches({given}={value}), but this job was submitted with "
                             f"{given} = {job}: give the script (its args) the job's number "
                             "(`shoal submit --steps/--global-batch`)")


def _fetch(dataset: Any, ids: np.ndarray) -> Any:
    """A batch of samples: `dataset.get_batch(ids)` if it has one, else default collation."""
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(ids)
    return torch.utils.data.default_collate([dataset[int(i)] for i in ids])


def join(config: RunConfig | None = None, hook: StepHook | None = None) -> Run:
    """Join the job this process was launched for (by `shoal run` or the coordinator).
    `hook`: proof of learning's calls at each step; `shoal.join` builds it from the
    run's config, so a cheat the launcher asked for is never silently honest here."""
    config = config or RunConfig.from_env()
    adversary = config.settings.adversary
    if hook is None and adversary:
        raise TrainError(f"this worker was told to cheat as {adversary!r}: join with "
                         "shoal.join(), which runs adversaries and records work")
    faults = InjectedFaults.parse(config.settings.inject, config.worker, config.run_dir)
    return Run(config, hook if hook is not None else NoStepHook(), faults)
