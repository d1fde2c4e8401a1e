"""Judging a batch of device swaps at once, for the local search.

A swap changes at most two stage groups, so the slowest link inside each
group is updated from per-row minima (and second minima) of the current
layout instead of recomputed over every pair: O(dp) per swap, not O(dp^2),
which is what lets a thousand devices be planned in seconds.
"""

from __future__ import annotations

import numpy as np

from shoal.plan.cluster import Topology
from shoal.plan.cost import CostConfig, evaluate
from shoal.spec.plan import ModelProfile


class SwapJudge:
    """Costs of swaps of slots in one layout; slots[:pp*dp] is the grid, row-major."""

    def __init__(self, top: Topology, model: ModelProfile, pp: int, dp: int, cost: CostConfig,
                 previous_stage: np.ndarray | None = None, move_cost: float = 0.0) -> None:
        self.top, self.model, self.pp, self.dp, self.cost = top, model, pp, dp, cost
        self.used = pp * dp
        # Re-planning: device -> its stage before (-1 if new); each one moved costs a share.
        self.previous, self.move_cost = previous_stage, move_cost

    def full(self, slots: np.ndarray) -> np.ndarray:
        """(K,) objective of K slot arrays, every group judged from scratch."""
        grids = slots[:, : self.used].reshape(len(slots), self.pp, self.dp)
        return self._penalized(slots, evaluate(self.top, self.model, grids, self.cost).step_s)

    def reset(self, slots: np.ndarray, changed: np.ndarray | None = None) -> None:
        """Take `slots` as the layout that swaps are applied to; if only the stages
        `changed` differ from the last layout taken, only theirs are recomputed."""
        self.slots = slots
        self.grid = slots[: self.used].reshape(self.pp, self.dp)
        if self.dp == 1:
            return
        stages = np.arange(self.pp) if changed is None else changed[changed < self.pp]
        group = self.grid[stages]
        rows, cols = group[:, :, None], group[:, None, :]
        eye = np.eye(self.dp, dtype=bool)
        bandwidth = np.where(eye, np.inf, self.top.bandwidth[rows, cols])  # (S, dp, dp)
        latency = np.where(eye, -np.inf, self.top.latency_s[rows, cols])
        if changed is None:
            self.bw, self.lat = _two_smallest(bandwidth), _two_smallest(-latency)
            return
        for cache, fresh in ((self.bw, _two_smallest(bandwidth)),
                             (self.lat, _two_smallest(-latency))):
            for old, new in zip(cache, fresh):
                old[stages] = new

    def swaps(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The layouts after each swap (S, n) of the reset layout, and their objective (S,)."""
        slots, s = self.slots, len(pairs)
        a, b = pairs[:, 0], pairs[:, 1]
        candidates = np.repeat(slots[None], s, axis=0)
        rows = np.arange(s)
        candidates[rows, a], candidates[rows, b] = slots[b], slots[a]
        grids = candidates[:, : self.used].reshape(s, self.pp, self.dp)
        links = None
        if self.dp > 1:
            bandwidth = np.repeat(self.bw[0].min(axis=1)[None], s, axis=0)
            latency = np.repeat(-self.lat[0].min(axis=1)[None], s, axis=0)
            for out, into in ((a, b), (b, a)):  # slot `out` gets the device from slot `into`
                self._replace(out, slots[into], (into // self.dp) != (out // self.dp),
                              bandwidth, latency)
            links = (bandwidth, latency)
        step = evaluate(self.top, self.model, grids, self.cost, links=links).step_s
        return candidates, self._penalized(candidates, step)

    def _replace(self, out: np.ndarray, device: np.ndarray, moves: np.ndarray,
                 bandwidth: np.ndarray, latency: np.ndarray) -> None:
        """Update group links where slot `out` (in the grid, other stage) takes `device`."""
        hit = np.flatnonzero((out < self.used) & moves)
        if not len(hit):
            return
        stage, pos, new = out[hit] // self.dp, out[hit] % self.dp, device[hit]
        members = self.grid[stage]  # (H, dp)
        other = np.arange(self.dp)[None, :] != pos[:, None]
        for (first, where, second), table, sign, result in (
                (self.bw, self.top.bandwidth, 1.0, bandwidth),
                (self.lat, self.top.latency_s, -1.0, latency)):
            # Without the leaving device: each remaining row's best link not to it.
            rest = np.where(where[stage] == pos[:, None], second[stage], first[stage])
            rest = np.where(other, rest, np.inf).min(axis=1)
            joined = np.where(other, sign * table[new[:, None], members], np.inf).min(axis=1)
            result[hit, stage] = sign * np.minimum(rest, joined)

    def _penalized(self, slots: np.ndarray, step: np.ndarray) -> np.ndarray:
        if self.previous is None or self.move_cost == 0.0:
            return step
        stage = np.full(slots.shape, -2)
        stage[:, : self.used] = np.arange(self.used) // self.dp
        stage_of = np.empty_like(stage)
        np.put_along_axis(stage_of, slots, stage, axis=1)  # device -> its stage now
        kept = self.previous >= 0
        moved = ((stage_of != self.previous[None]) & kept[None]).sum(axis=1)
        return step * (1.0 + self.move_cost * moved)


def _two_smallest(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of (pp, dp, dp): the smallest value, where it is, and the second smallest."""
    where = values.argmin(axis=2)
    first = np.take_along_axis(values, where[..., None], axis=2)[..., 0]
    masked = values.copy()
    np.put_along_axis(masked, where[..., None], np.inf, axis=2)
    return first, where, masked.min(axis=2)
