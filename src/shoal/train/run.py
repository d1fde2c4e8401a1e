"""The elastic training API: a few lines around a plain PyTorch loop.

    run = shoal.train.join()
    model, optimizer = run.wrap(model, optimizer)
    for batch in run.batches(dataset, global_batch=256, steps=1000):
        run.backward(model_loss(model, batch))
        run.step()

`batches` yields this worker's share of each step (in micro-batches);
`step` exchanges gradients when the share is done, commits or discards the
step with every other worker, and re-forms the group when membership
changes. Faults never reach the loop: a failed step is redone, with the
same samples, by whoever is left.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from shoal.spec.elastic import BatchPolicy, MembershipEpoch
from shoal.train import inject
from shoal.train.checkpoint import CheckpointStore, Snapshot, detached_copy
from shoal.train.commit import Excluded, agree
from shoal.train.errors import TrainError
from shoal.train.group import EpochGroup, GroupCancelled, GroupFailed
from shoal.train.guard import StepGuard, Verdict
from shoal.train.hashing import param_sha256
from shoal.train.membership import form_epoch
from shoal.train.order import DataOrder, share_positions, split_shares
from shoal.train.rendezvous import Rendezvous, connect
from shoal.train.run_config import RunConfig
from shoal.train.step_log import StepLog

log = logging.getLogger(__name__)


class ElasticOptimizer:
    """The user's optimizer, stepped only by the run when a step commits."""

    def __init__(self, run: Run, inner: torch.optim.Optimizer) -> None:
        self._run, self.inner = run, inner

    def step(self, closure: Any = None) -> None:
        self._run.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients are owned by the run (they live in its exchange buffer)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Run:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.worker = config.worker
        self.rdzv = Rendezvous(connect(config.host, config.port))
        self.step_index = 0  # steps committed by the job so far
        self.cursor = 0  # stream position of the next step's first sample
        self.has_state = False
        self.left = False  # this worker handed over and left (SIGTERM)
        self.lr_scale = 1.0  # `linear` batch policy: world / first world
        self.record: MembershipEpoch | None = None
        self.group: EpochGroup | None = None
        self.rank, self.world = 0, 0
        self.guard = StepGuard(config.guard)
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._last_good: dict[str, Any] | None = None
        self._weights: tuple[float, ...] = ()
        self._speed: float | None = None
        self._leave_wanted = threading.Event()
        self._leave_posted = False
        self._awaiting_admission = False
        self._first_step_of_epoch = True
        self._final: dict[str, object] | None = None
        self._base_world: int | None = None
        self._checkpoints = (CheckpointStore(config.checkpoint_dir, config.identity, config.checkpoint_keep)
                             if config.checkpoint_dir else None)
        self.step_log = StepLog(config.run_dir, self.worker)
        self._heartbeat_stop = threading.Event()
        threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: self._leave_wanted.set())

    # -- the user's side --------------------------------------------------

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             grad_clip: float = 0.0) -> tuple[torch.nn.Module, ElasticOptimizer]:
        self.model, self.optimizer, self.grad_clip = model, optimizer, grad_clip
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._fresh_buffer()
        return model, ElasticOptimizer(self, optimizer)

    def batches(self, dataset: Any, global_batch: int, steps: int, *, seed: int = 0,
                micro_batch: int | None = None,
                policy: BatchPolicy = BatchPolicy.invariant) -> Iterator[Any]:
        """This worker's share of every step, in micro-batches, until `steps` commit."""
        if self.model is None:
            raise TrainError("call run.wrap(model, optimizer) before run.batches(...)")
        order = DataOrder(_num_samples(dataset), seed)
        while self._enter_membership():
            if self.step_index >= steps:
                break
            if self._leave_wanted.is_set() and self.world == 1:
                self._last_one_leaves()
                break
            shares = self._shares(global_batch, policy)
            ids = order.sample_ids(share_positions(self.cursor, shares, self.rank))
            self._begin(shares, global_batch=sum(shares))
            if len(ids) == 0:
                self._finish_step()
                continue
            for chunk in np.array_split(ids, -(-len(ids) // (micro_batch or len(ids)))):
                self._chunk = len(chunk)
                yield _fetch(dataset, chunk)
                if self._chunk:  # the loop must call run.step() after each batch
                    raise TrainError("call run.step() (or optimizer.step()) once per batch")
        self._finish(steps)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a micro-batch's mean loss, weighted by its part of the global batch."""
        weight = self._chunk / self._global_batch
        if inject.nan_loss(self.worker, self.step_index):
            loss = loss * float("nan")
        (loss * weight).backward()
        self._loss_sum += float(loss.detach()) * self._chunk

    def step(self) -> None:
        self._done_samples += self._chunk
        self._chunk = 0
        if self._done_samples >= self._share:
            self._finish_step()

    # -- one step ----------------------------------------------------------

    def _begin(self, shares: tuple[int, ...], global_batch: int) -> None:
        self._shares_now, self._global_batch = shares, global_batch
        self._share, self._done_samples, self._chunk = shares[self.rank], 0, 0
        self._loss_sum = 0.0
        self._attempt_start = time.time()

    def _finish_step(self) -> None:
        compute_s = time.time() - self._attempt_start
        self._slow_down(compute_s)
        self._measure_speed()
        if self._leave_wanted.is_set() and not self._leave_posted:
            self.rdzv.request_leave(self.worker)
            self._leave_posted = True
        self._sync_grads_into_buffer()
        self._write_step_scalars()
        ok = True
        try:
            self.group.all_reduce(self._flat, self._membership_changed)
        except (GroupFailed, GroupCancelled) as error:
            log.info("[epoch %d rank %d] step %d exchange failed: %s",
                     self.record.epoch, self.rank, self.step_index, error)
            ok = False
        try:
            decision = agree(self.rdzv, self.record, self.rank, self.step_index, ok,
                             poll_s=self.config.poll_s, weights=self._proposed_weights)
        except Excluded as error:
            log.warning("[worker %s] %s; rejoining with fresh state", self.worker, error)
            self._drop_group(stale=True)
            return
        if decision.commit:
            self._apply()
            if decision.weights:
                self._weights = decision.weights
        else:
            self._fresh_buffer()  # a buffer handed to a failed collective is never reused
        if not decision.commit or decision.next_epoch is not None:
            self._drop_group(stale=False)

    def _write_step_scalars(self) -> None:
        """After the gradients: each group's learning rate (from workers that ran the
        loop body this step), how many did, the loss sum and the sample count."""
        ran = 1.0 if self._share > 0 else 0.0
        groups = self.optimizer.param_groups
        tail = [float(g["lr"]) * ran for g in groups] + [ran, self._loss_sum, float(self._share)]
        self._flat[self._grad_numel:] = torch.tensor(tail, dtype=self._flat.dtype)

    def _read_step_scalars(self) -> float:
        """Agree on the learning rates (a worker with an empty share skipped the loop
        body that sets them) and return the global mean loss."""
        groups = self.optimizer.param_groups
        tail = self._flat[self._grad_numel:].tolist()
        ran = max(1.0, tail[len(groups)])
        for g, lr_sum in zip(groups, tail):
            g["lr"] = lr_sum / ran
        return tail[-2] / max(1.0, tail[-1])

    def _apply(self) -> None:
        loss = self._read_step_scalars()
        verdict, reason = self.guard.judge(loss, self._flat[: self._grad_numel])
        if verdict is Verdict.apply:
            if self.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self._params, self.grad_clip)
            self._optimizer_step()
        else:
            log.warning("[epoch %d] step %d not applied: %s", self.record.epoch, self.step_index, reason)
            if verdict is Verdict.rollback and self._last_good is not None:
                self._load_model_state(self._last_good)
                log.warning("rolled back model and optimizer to the last good state")
        self._flat.zero_()
        t_commit = time.time()
        self.step_index += 1
        self.cursor += self._global_batch
        check = self.config.replica_check_interval
        fingerprint = (param_sha256(self.model)
                       if self._first_step_of_epoch or (check and self.step_index % check == 0) else None)
        self._first_step_of_epoch = False
        self.step_log.write(self, loss if verdict is Verdict.apply else None,
                            verdict is Verdict.apply, t_commit, fingerprint)
        if verdict is Verdict.apply and self.step_index % self.config.guard.snapshot_interval == 0:
            self._last_good = detached_copy(self._model_state())
        if self.rank == 0:
            self.rdzv.report_progress(self.step_index)
            if self._checkpoints and self.step_index % self.config.checkpoint_interval == 0:
                self._checkpoints.save_async(self._snapshot())

    def _optimizer_step(self) -> None:
        if self.lr_scale != 1.0:
            saved = [g["lr"] for g in self.optimizer.param_groups]
            for g in self.optimizer.param_groups:
                g["lr"] *= self.lr_scale
            self.optimizer.step()
            for g, lr in zip(self.optimizer.param_groups, saved):
                g["lr"] = lr
        else:
            self.optimizer.step()

    # -- membership ---------------------------------------------------------

    def _membership_changed(self) -> bool:
        """A newer epoch that drops one of our members makes the current exchange moot."""
        latest = self.rdzv.latest_epoch()
        if latest <= self.record.epoch:
            return False
        return not set(self.record.members) <= set(self.rdzv.epoch(latest).members)

    def _enter_membership(self) -> bool:
        """Block until this worker is in a formed epoch; False once it has left."""
        while self.group is None:
            record = self._next_record()
            if record is None:
                self.left = True
                return False
            try:
                formed = form_epoch(
                    self.rdzv, record, self.worker, step=self.step_index, has_state=self.has_state,
                    backend=self.config.backend, timeout_s=self.config.collective_timeout_s,
                    poll_s=self.config.poll_s,
                    newer=lambda epoch=record.epoch: self.rdzv.latest_epoch() > epoch,
                    live_state=self.state_dict, load_state=self.load_state_dict,
                    load_from_disk=self._load_checkpoint)
            except (GroupFailed, GroupCancelled) as error:
                log.info("[worker %s] epoch %d did not form (%s); trying the next", self.worker,
                         record.epoch, error)
                self.record = record
                continue
            self.record, self.group = record, formed.group
            self.rank, self.world = formed.rank, len(record.members)
            self._weights = record.weights
            self.has_state = True
            self._first_step_of_epoch = True
            self._base_world = self._base_world or self.world
            log.info("[epoch %d rank %d/%d] formed at step %d (%s)%s", record.epoch, self.rank,
                     self.world, self.step_index, record.reason,
                     " after receiving state" if formed.received_state else "")
        return True

    def _next_record(self) -> MembershipEpoch | None:
        """The next epoch that includes this worker (asking to join when none does);
        None if this worker wants to leave and is no longer a member."""
        seen = self.record.epoch if self.record is not None else -1
        while True:
            latest = self.rdzv.latest_epoch()
            record = self.rdzv.epoch(latest) if latest >= 0 else None
            if record is not None and self.worker in record.members:
                if latest > seen:
                    self._awaiting_admission = False
                    return record
            elif self._leave_wanted.is_set() or self.rdzv.done():
                return None  # leaving, or the job finished before this worker got in
            elif not self._awaiting_admission:
                if self.record is not None:
                    self.has_state = False  # dropped while stalled: our state is stale
                elif self.config.spare and not self.rdzv.activated(self.worker):
                    # A warm spare: started, model built, waiting to be called in.
                    time.sleep(self.config.poll_s * 10)
                    continue
                self.rdzv.request_join(self.worker)
                self._awaiting_admission = True
            time.sleep(self.config.poll_s)

    def _drop_group(self, stale: bool) -> None:
        if self.group is not None:
            self.group.abandon()
        self.group = None
        if stale:
            self.has_state = False
            self._fresh_buffer()

    def _shares(self, global_batch: int, policy: BatchPolicy) -> tuple[int, ...]:
        if policy is BatchPolicy.linear:
            per_worker = max(1, global_batch // self._base_world)
            self.lr_scale = self.world / self._base_world
            return tuple(per_worker for _ in range(self.world))
        # A slow worker keeps at least a quarter of an equal share: enough to keep
        # measuring its speed, so a noisy measurement cannot starve it for good.
        return split_shares(global_batch, list(self._weights),
                            min_share=max(1, global_batch // (4 * self.world)))

    # -- speed, buffers and state --------------------------------------------

    def _slow_down(self, compute_s: float) -> None:
        """Simulated slower device (SHOAL_SLOWDOWN, for tests and benchmarks)."""
        if self.config.slowdown > 1.0 and compute_s > 0:
            time.sleep((self.config.slowdown - 1.0) * compute_s)

    def _measure_speed(self) -> None:
        """This worker's samples/s over the attempt, a simulated slowdown included."""
        if self._share == 0:
            return
        elapsed = max(1e-6, time.time() - self._attempt_start)
        speed = self._share / elapsed
        self._speed = speed if self._speed is None else 0.8 * self._speed + 0.2 * speed
        if self.step_index % self.config.speed_report_interval == 0:
            self.rdzv.report_speed(self.worker, self._speed)

    def _proposed_weights(self) -> tuple[float, ...] | None:
        """New shares from measured speeds, every rebalance_interval steps, if they moved >10%."""
        interval = self.config.rebalance_interval
        if not interval or (self.step_index + 1) % interval:
            return None
        speeds = self.rdzv.speeds(self.record.members)
        if any(s is None for s in speeds):
            return None
        total_new, total_old = sum(speeds), sum(self._weights)
        moved = max(abs(n / total_new - o / total_old) for n, o in zip(speeds, self._weights))
        return tuple(speeds) if moved > 0.1 / len(speeds) else None

    def _fresh_buffer(self) -> None:
        """One flat buffer for all gradients (+ step scalars), parameters' .grad as views."""
        total = sum(p.numel() for p in self._params)
        self._grad_numel = total
        scalars = len(self.optimizer.param_groups) + 3  # see _write_step_scalars
        self._flat = torch.zeros(total + scalars, dtype=torch.float32, device=self._params[0].device)
        offset = 0
        for p in self._params:
            p.grad = self._flat[offset: offset + p.numel()].view_as(p)
            offset += p.numel()

    def _sync_grads_into_buffer(self) -> None:
        """If user code replaced .grad (e.g. zero_grad(set_to_none=True)), copy it back in."""
        offset = 0
        for p in self._params:
            view = self._flat[offset: offset + p.numel()]
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.reshape(-1))
            p.grad = view.view_as(p)
            offset += p.numel()

    def _model_state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def _load_model_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def state_dict(self) -> dict[str, Any]:
        """Everything a replica needs to continue exactly where this one is."""
        return {**self._model_state(), "rng": torch.get_rng_state(), "step": self.step_index,
                "cursor": self.cursor, "guard": self.guard.state_dict(), "base_world": self._base_world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_model_state(state)
        torch.set_rng_state(state["rng"])
        self.step_index, self.cursor = state["step"], state["cursor"]
        self.guard.load_state_dict(state["guard"])
        self._base_world = state.get("base_world") or self._base_world
        self._fresh_buffer()

    def _snapshot(self) -> Snapshot:
        return Snapshot(self.step_index, self.cursor, detached_copy(self.state_dict()))

    def _load_checkpoint(self) -> bool:
        if self._checkpoints is None:
            return False
        snapshot = self._checkpoints.load_latest()
        if snapshot is None:
            return False
        self.load_state_dict({**snapshot.state, "step": snapshot.step, "cursor": snapshot.cursor})
        log.info("[worker %s] restored step %d from %s", self.worker, snapshot.step,
                 self._checkpoints.directory)
        return True

    # -- liveness and the end ------------------------------------------------

    def _last_one_leaves(self) -> None:
        """No peer to hand over to: leave the state on disk for whoever comes next."""
        if self._checkpoints is not None:
            self._checkpoints.save_async(self._snapshot())
            self._checkpoints.wait()
            log.warning("[worker %s] last worker leaving: checkpoint of step %d written",
                        self.worker, self.step_index)
        else:
            log.warning("[worker %s] last worker leaving with no checkpoint directory: "
                        "step %d is lost", self.worker, self.step_index)
        self.rdzv.request_leave(self.worker)
        self.left = True

    def _heartbeat(self) -> None:
        # Its own store connection: the main thread may be blocked in a store call.
        rdzv = Rendezvous(connect(self.config.host, self.config.port))
        while not self._heartbeat_stop.wait(self.config.heartbeat_s):
            try:
                rdzv.heartbeat(self.worker)
            except (RuntimeError, OSError) as error:
                log.debug("heartbeat failed: %s", error)

    def _finish(self, steps: int) -> None:
        if self.group is not None and self.rank == 0 and self.step_index >= steps and not self.left:
            if self._checkpoints is not None:
                self._checkpoints.save_async(self._snapshot())
            self._final = {"steps": self.step_index, "param_sha256": param_sha256(self.model)}
            self.rdzv.mark_done(self._final)
        if self._checkpoints is not None:
            self._checkpoints.close()
        self.step_log.close()
        self._heartbeat_stop.set()
        if self.group is not None:
            self.group.abandon()
            self.group = None
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
            self.rdzv.mark_done(self._final)


def _num_samples(dataset: Any) -> int:
    count = getattr(dataset, "num_samples", None)
    count = count() if callable(count) else count
    return int(count if count is not None else len(dataset))


def _fetch(dataset: Any, ids: np.ndarray) -> Any:
    """A batch of samples: `dataset.get_batch(ids)` if it has one, else default collation."""
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(ids)
    return torch.utils.data.default_collate([dataset[int(i)] for i in ids])


def join(config: RunConfig | None = None) -> Run:
    """Join the job this process was launched for (by `shoal run` or the coordinator)."""
    return Run(config or RunConfig.from_env())
