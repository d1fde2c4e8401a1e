"""Who computes how much of each step: shares from measured device speed.

Each worker measures its own samples/s (a simulated slowdown included) over
the time a step costs it alone: its compute and its own part of the commit
(the optimizer step, snapshots, logs), never the time it waits for others.
Shares proportional to that converge to equal own-times, the balance point,
even when a slow device's fixed per-step cost is large. Workers publish their
speeds; every `rebalance_interval` steps the members' ballots say new weights
are due, the membership authority computes them from the speeds if they moved,
and the step's decision carries them, so every member switches shares at the
same step.
"""

from __future__ import annotations

import time
from typing import Protocol

from shoal.spec.elastic import BatchPolicy
from shoal.train.order import split_shares


class SpeedReporter(Protocol):
    """Where a worker's speed goes: the store, or a thread that writes it there."""

    def report_speed(self, worker: str, samples_per_s: float) -> None: ...


class ShareBalancer:
    def __init__(self, worker: str, rebalance_interval: int, report_interval: int,
                 slowdown: float) -> None:
        self.worker = worker
        self.rebalance_interval = rebalance_interval
        self.report_interval = report_interval
        self.slowdown = slowdown  # simulate a device this many times slower
        self.weights: tuple[float, ...] = ()
        self.base_world: int | None = None  # world size of the first epoch (linear policy)
        self.lr_scale = 1.0  # linear policy: world / base world
        self._speed: float | None = None
        self._apply_s = 0.0  # this worker's own time committing a step (EMA)

    def shares(self, global_batch: int, world: int, policy: BatchPolicy) -> tuple[int, ...]:
        if policy is BatchPolicy.linear:
            per_worker = max(1, global_batch // self.base_world)
            self.lr_scale = world / self.base_world
            return tuple(per_worker for _ in range(world))
        # A slow worker keeps at least a quarter of an equal share: enough to keep
        # measuring its speed, so a noisy measurement cannot starve it for good.
        return split_shares(global_batch, list(self.weights),
                            min_share=max(1, global_batch // (4 * world)))

    def enter_epoch(self, weights: tuple[float, ...]) -> None:
        """Take a new epoch's weights (the authority's, from measured speeds), or equal
        ones when rebalancing is off: off means shares never follow speed, not even
        when the group re-forms."""
        self.weights = weights if self.rebalance_interval else (1.0,) * len(weights)

    def after_compute(self, reporter: SpeedReporter, share: int, started: float,
                      step: int) -> None:
        """Apply the simulated slowdown, then update and publish this worker's speed."""
        compute_s = time.time() - started
        if self.slowdown > 1.0 and compute_s > 0:
            time.sleep((self.slowdown - 1.0) * compute_s)
        if share == 0:
            return
        speed = share / max(1e-6, time.time() - started + self._apply_s)
        self._speed = speed if self._speed is None else 0.8 * self._speed + 0.2 * speed
        if step % self.report_interval == 0:
            reporter.report_speed(self.worker, self._speed)

    def after_apply(self, seconds: float) -> None:
        """How long applying a committed step took this worker (its optimizer step, its
        snapshot): a fixed cost per step that its share must leave room for."""
        self._apply_s = seconds if not self._apply_s else 0.8 * self._apply_s + 0.2 * seconds

    def rebalance_due(self, step: int, span: int = 1) -> bool:
        """Does the step just exchanged close a rebalance interval (new weights due)?
        `span`: the steps one vote closes (a DiLoCo round votes once for all of its
        steps): due if the interval ends in any of them."""
        interval = self.rebalance_interval
        return bool(interval) and (step + 1) // interval != max(0, step + 1 - span) // interval


def moved_weights(speeds: list[float | None],
                  weights: tuple[float, ...]) -> tuple[float, ...] | None:
    """New weights from measured speeds, if any member's part moved by more than 2% of
    an equal share (new weights cost nothing: the decision carries them, and a larger
    dead band left the slowest worker 13% behind the balance point); None if not, or
    while a member has no speed yet."""
    if not speeds or any(s is None for s in speeds) or len(speeds) != len(weights):
        return None
    total_new, total_old = sum(speeds), sum(weights)
    moved = max(abs(n / total_new - o / total_old) for n, o in zip(speeds, weights))
    return tuple(speeds) if moved > 0.02 / len(speeds) else None
