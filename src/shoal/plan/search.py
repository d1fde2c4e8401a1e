"""The planner's search: shapes, first layouts, then local search on the cost model.

For each shape (dp replicas x pp stages, as many devices as fit) the
constructions of `construct` give first layouts; the most promising shapes
are refined by swapping devices (between stages, between replicas, in and
out of use), a batch of swaps judged at once, with a few random kicks to
leave local optima. Deterministic for a given seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shoal.plan import construct
from shoal.plan.cluster import Topology
from shoal.plan.cost import CostConfig, evaluate, micro_batches
from shoal.plan.errors import ModelDoesNotFit
from shoal.plan.moves import SwapJudge
from shoal.spec.plan import ModelProfile


@dataclass(frozen=True)
class SearchConfig:
    cost: CostConfig = field(default_factory=CostConfig)
    refine: int = 3  # shapes, best first, that get a local search...
    refine_within: float = 1.5  # ...and any other whose first layout is this close to the best
    refine_all_up_to: int = 16  # devices: in clusters this small every shape is refined
    rounds: int = 150  # local-search rounds per shape, kicks included
    moves: int = 96  # swaps judged per round (all of them when there are fewer)
    patience: int = 12  # sampled rounds without gain that end a descent
    kicks: int = 6  # random perturbations of the best layout, each followed by a descent
    # ...and in clusters of at most `refine_all_up_to` devices, where a descent is cheap:
    # 6 left 2 of 150 random clusters of 3-8 devices 13-41% off the optimum, 30 one of
    # the next 150 4% off; 80 left none of 500 off (each plan still well under a second).
    small_kicks: int = 80
    seed: int = 0
    only_shapes: tuple[tuple[int, int], ...] = ()  # (dp, pp) to restrict the search to, if any

    def __post_init__(self) -> None:
        if (min(self.refine, self.rounds, self.moves, self.patience) < 1
                or min(self.kicks, self.small_kicks) < 0):
            raise ValueError("refine, rounds, moves and patience must be at least 1; kicks >= 0")
        if self.refine_within < 1.0:
            raise ValueError("refine_within must be at least 1")


@dataclass(frozen=True)
class Layout:
    """Devices in place: grid[j, r] is stage j of replica r; `unused` sit out."""

    grid: np.ndarray  # (pp, dp) device indices
    unused: np.ndarray  # device indices
    step_s: float

    @property
    def shape(self) -> tuple[int, int]:
        pp, dp = self.grid.shape
        return dp, pp


def shapes(top: Topology, model: ModelProfile) -> list[tuple[int, int]]:
    """Every (dp, pp) to consider: pp stages up to the layer count, dp as large as fits
    (but no more replicas than micro-batches in the batch: the rest would idle)."""
    most = max(1, model.batch_samples // model.micro_batch_samples)
    return [(min(top.size // pp, most), pp) for pp in range(1, min(model.layers, top.size) + 1)]


def first_layouts(top: Topology, model: ModelProfile, dp: int, pp: int) -> list[np.ndarray]:
    """The constructions' grids for one shape (duplicates possible)."""
    members, _ = construct.used_devices(top, dp * pp)
    message = model.activation_bytes_per_sample * model.micro_batch_samples
    exchange = model.parameters / pp * model.gradient_bytes_per_parameter
    m = micro_batches(model, dp)
    paths: dict = {}  # pipelines both pipeline constructions build are ordered once
    return [
        construct.tight_stages(top, members, dp, pp, exchange, message, m),
        construct.tight_pipelines(top, members, dp, pp, message, paths),
        construct.speed_stages(top, members, dp, pp, message, m),
        construct.regional_pipelines(top, dp, pp, message, paths),
    ]


def search(top: Topology, model: ModelProfile, config: SearchConfig = SearchConfig()) -> Layout:
    """The best layout found for `model` on `top`."""
    rng = np.random.default_rng(config.seed)
    starts = []
    for dp, pp in config.only_shapes or shapes(top, model):
        if dp * pp > top.size:
            continue
        grids = np.stack(first_layouts(top, model, dp, pp))
        step = evaluate(top, model, grids, config.cost).step_s
        best = int(np.argmin(step))
        if np.isfinite(step[best]):
            starts.append((float(step[best]), grids[best]))
    if not starts:
        need = model.parameters * model.state_bytes_per_parameter / 1e9
        raise ModelDoesNotFit(model.name, need, float(top.memory_bytes.sum()) / 1e9)
    starts.sort(key=lambda s: s[0])
    if top.size > config.refine_all_up_to:
        starts = [s for i, s in enumerate(starts)
                  if i < config.refine or s[0] <= starts[0][0] * config.refine_within]
    found = [improve(top, model, grid, config, rng) for _, grid in starts]
    return min(found, key=lambda layout: layout.step_s)


def improve(top: Topology, model: ModelProfile, grid: np.ndarray, config: SearchConfig,
            rng: np.random.Generator, previous_stage: np.ndarray | None = None,
            move_cost: float = 0.0) -> Layout:
    """Local search from `grid`; with `previous_stage` (device -> stage or -1), each device
    moved off its stage costs `move_cost` of the step time, so it moves only for a gain."""
    pp, dp = grid.shape
    slots = np.concatenate([grid.ravel(), np.setdiff1d(np.arange(top.size), grid.ravel())])
    judge = SwapJudge(top, model, pp, dp, config.cost, previous_stage, move_cost)
    pairs = _all_swaps(top.size, pp * dp, dp)
    best, best_cost = slots, judge.full(slots[None])[0]
    current, current_cost, rounds, kicks = best, best_cost, 0, 0
    while rounds < config.rounds and len(pairs):
        current, current_cost, spent = _descend(judge, pairs, current, current_cost, config, rng,
                                                config.rounds - rounds)
        rounds += spent
        if current_cost < best_cost:
            best, best_cost = current, current_cost
        if kicks >= (config.small_kicks if top.size <= config.refine_all_up_to else config.kicks):
            break
        kicks += 1
        current = _kick(best, dp * pp, rng)
        current_cost = judge.full(current[None])[0]
    step = float(evaluate(top, model, best[None, : dp * pp].reshape(1, pp, dp), config.cost)
                 .step_s[0])
    return Layout(grid=best[: dp * pp].reshape(pp, dp), unused=np.sort(best[dp * pp:]),
                  step_s=step)


def _descend(judge: SwapJudge, pairs: np.ndarray, slots: np.ndarray, cost: float,
             config: SearchConfig, rng: np.random.Generator,
             budget: int) -> tuple[np.ndarray, float, int]:
    """Best-improvement swaps until none helps (all tried) or `patience` sampled rounds fail."""
    exhaustive = len(pairs) <= config.moves
    stale = rounds = 0
    judge.reset(slots)
    while rounds < budget:
        rounds += 1
        batch = pairs if exhaustive else pairs[rng.choice(len(pairs), config.moves, replace=False)]
        candidates, costs = judge.swaps(batch)
        pick = int(np.argmin(costs))
        if costs[pick] < cost * (1 - 1e-9):
            slots, cost, stale = candidates[pick], float(costs[pick]), 0
            judge.reset(slots, changed=np.unique(batch[pick] // judge.dp))
        elif exhaustive:
            break
        else:
            stale += 1
            if stale >= config.patience:
                break
    return slots, cost, rounds


def _all_swaps(n: int, used: int, dp: int) -> np.ndarray:
    """(S, 2) slot pairs whose swap can change the cost: not two unused devices, and with a
    single stage, only swaps with unused devices (its members are interchangeable)."""
    a, b = np.triu_indices(n, k=1)
    keep = a < used
    if used == dp:
        keep &= b >= used
    return np.stack([a[keep], b[keep]], axis=1)


def _kick(slots: np.ndarray, used: int, rng: np.random.Generator, swaps: int = 2) -> np.ndarray:
    kicked = slots.copy()
    for _ in range(swaps):
        a, b = rng.choice(len(slots), 2, replace=False)
        if min(a, b) < used:
            kicked[a], kicked[b] = kicked[b], kicked[a]
    return kicked
