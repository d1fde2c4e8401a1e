"""What one replica holds: model, optimizer, RNG, position in the data stream,
guard history, and the last good state a rollback returns to.

All of it travels to a joiner in one transfer, so a worker that joined
after the last snapshot rolls back to the same state as everyone else.
Disk checkpoints hold the same state without the rollback snapshot; a
replica restored from disk takes the restored state as its last good one.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from shoal.train.checkpoint import CheckpointStore, Snapshot, detached_copy
from shoal.train.guard import StepGuard
from shoal.train.shares import ShareBalancer

log = logging.getLogger(__name__)


class ReplicaState:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, guard: StepGuard,
                 balancer: ShareBalancer, checkpoints: CheckpointStore | None) -> None:
        self.model, self.optimizer, self.guard = model, optimizer, guard
        self.balancer = balancer
        self.checkpoints = checkpoints
        self.step = 0  # steps committed by the job so far
        self.cursor = 0  # stream position of the next step's first sample
        self.held = False  # this worker holds the job's live state
        self.last_good: dict[str, Any] | None = None  # model and optimizer a rollback returns to
        self.last_good_step: int | None = None  # the step `last_good` is the start of
        # More state that travels with the replica (e.g. DiLoCo's theta_outer): objects with
        # state_dict() / load_state_dict(state or None), loaded after the model.
        self.extras: dict[str, Any] = {}

    def advance(self, global_batch: int, snapshot: bool) -> None:
        """A step committed; every `snapshot_interval` applied steps, keep it as last good."""
        self.step += 1
        self.cursor += global_batch
        if snapshot and self.step % self.guard.config.snapshot_interval == 0:
            self.last_good = detached_copy(self._model_state())
            self.last_good_step = self.step

    def roll_back(self) -> bool:
        """Back to the last good state; False (nothing done) if none was kept yet."""
        if self.last_good is None:
            log.warning("rollback asked for before any good state was kept; step skipped only")
            return False
        self._load_model_state(self.last_good)
        log.warning("rolled back model and optimizer to the last good state")
        return True

    def state_dict(self, with_last_good: bool = True) -> dict[str, Any]:
        """Everything a replica needs to continue exactly where this one is."""
        state = {**self._model_state(), "rng": torch.get_rng_state(), "step": self.step,
                 "cursor": self.cursor, "guard": self.guard.state_dict(),
                 "base_world": self.balancer.base_world,
                 "extras": {name: extra.state_dict() for name, extra in self.extras.items()}}
        if with_last_good:
            state["last_good"] = self.last_good
            state["last_good_step"] = self.last_good_step
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_model_state(state)
        torch.set_rng_state(state["rng"])
        self.step, self.cursor = state["step"], state["cursor"]
        self.guard.load_state_dict(state["guard"])
        self.balancer.base_world = state.get("base_world") or self.balancer.base_world
        self.last_good = state.get("last_good")
        self.last_good_step = state.get("last_good_step")
        for name, extra in self.extras.items():
            extra.load_state_dict(state.get("extras", {}).get(name))

    def snapshot(self) -> Snapshot:
        return Snapshot(self.step, self.cursor, detached_copy(self.state_dict(with_last_good=False)))

    def disk_step(self) -> int | None:
        """The step of the newest checkpoint on this worker's disk (not yet verified)."""
        return self.checkpoints.latest_step() if self.checkpoints is not None else None

    def load_checkpoint(self) -> bool:
        """Restore the newest good checkpoint; False if there is none."""
        if self.checkpoints is None:
            return False
        snapshot = self.checkpoints.load_latest()
        if snapshot is None:
            return False
        self.load_state_dict({**snapshot.state, "step": snapshot.step, "cursor": snapshot.cursor})
        self.last_good = detached_copy(self._model_state())
        self.last_good_step = snapshot.step
        log.info("restored step %d from %s", snapshot.step, self.checkpoints.directory)
        return True

    def _model_state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def _load_model_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
