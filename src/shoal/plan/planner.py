"""The planner's entry points: plan a cluster, re-plan it when membership changes,
and the naive layouts (random, greedy) a plan is compared with."""

from __future__ import annotations

import numpy as np

from shoal.plan import construct
from shoal.plan.cluster import Topology, topology
from shoal.plan.cost import CostConfig, evaluate
from shoal.plan.search import Layout, SearchConfig, improve, search
from shoal.plan.sync import ladder
from shoal.spec.plan import Cluster, ModelProfile, Plan, StepBreakdown

# Re-planning moves a device off its stage (it must fetch that stage's weights)
# only for a gain of at least this share of the step time per device moved.
MOVE_COST = 0.002
# A fresh plan replaces the in-place one only if it is faster by more than this.
REPLAN_TOLERANCE = 0.05


def plan(cluster: Cluster, model: ModelProfile, config: SearchConfig = SearchConfig()) -> Plan:
    """The best plan found for `model` on `cluster`."""
    top = topology(cluster)
    return to_plan(top, model, search(top, model, config), config.cost)


def replan(previous: Plan, cluster: Cluster, model: ModelProfile,
           config: SearchConfig = SearchConfig()) -> Plan:
    """A plan for the cluster's new membership that keeps devices on their stages where it can.

    Survivors stay on their stage and, where their replica lost fewest devices, in
    their pipeline (in-place layout, holes filled by newcomers, then a local search
    that charges for every move); a fresh plan wins only if it is more than
    REPLAN_TOLERANCE faster.
    """
    top = topology(cluster)
    fresh = search(top, model, config)
    if previous.pp > min(model.layers, top.size):
        return to_plan(top, model, fresh, config.cost)
    index = {name: i for i, name in enumerate(top.names)}
    old = np.array([[index.get(name, -1) for name in stage] for stage in previous.stages])
    stage_of = np.full(top.size, -1)
    for j, row in enumerate(old):
        stage_of[row[row >= 0]] = j
    grid = _in_place(top, old, stage_of)
    rng = np.random.default_rng(config.seed)
    kept = improve(top, model, grid, config, rng, previous_stage=stage_of, move_cost=MOVE_COST)
    if np.isfinite(kept.step_s) and kept.step_s <= fresh.step_s * (1 + REPLAN_TOLERANCE):
        return to_plan(top, model, kept, config.cost)
    return to_plan(top, model, fresh, config.cost)


def _in_place(top: Topology, old: np.ndarray, stage_of: np.ndarray) -> np.ndarray:
    """(pp, dp) grid from the previous one, `old` (-1 where a device left): the replicas that
    lost fewest devices keep their whole pipelines; each hole takes a spare survivor of
    its own stage if there is one (it moves nowhere), else the fastest device left."""
    pp = len(old)
    dp = top.size // pp
    keep = np.sort(np.argsort((old < 0).sum(axis=0), kind="stable")[:dp])
    grid = np.full((pp, dp), -1)
    grid[:, : len(keep)] = old[:, keep]
    placed = set(grid.ravel().tolist())
    spare = [int(d) for d in np.argsort(-top.flops, kind="stable") if int(d) not in placed]
    for j in np.argsort((grid < 0).sum(axis=1), kind="stable")[::-1]:  # emptiest stage first
        for r in np.flatnonzero(grid[j] < 0):
            own = [d for d in spare if stage_of[d] == j]
            grid[j, r] = own[0] if own else spare[0]
            spare.remove(int(grid[j, r]))
    return grid


def to_plan(top: Topology, model: ModelProfile, layout: Layout,
            cost: CostConfig = CostConfig()) -> Plan:
    """The spec value of a layout, with its predicted step time and how it syncs."""
    pp, dp = layout.grid.shape
    costs = evaluate(top, model, layout.grid[None], cost)
    option = ladder(cost.sync)[int(costs.sync[0])]
    return Plan(
        dp=dp, pp=pp,
        stages=tuple(tuple(top.names[d] for d in row) for row in layout.grid),
        layers=tuple(int(x) for x in costs.layers[0]),
        unused=tuple(top.names[d] for d in layout.unused),
        mode=option.mode, inner_steps=option.inner_steps, codec=option.codec, slt=option.slt,
        step_time_s=float(costs.step_s[0]),
        breakdown=StepBreakdown(compute_s=float(costs.compute_s[0]),
                                pipeline_s=float(costs.pipeline_s[0]),
                                exchange_s=float(costs.exchange_s[0])),
    )


def layout_of(top: Topology, grid: np.ndarray, model: ModelProfile,
              cost: CostConfig = CostConfig()) -> Layout:
    """A grid judged by the cost model."""
    unused = np.setdiff1d(np.arange(top.size), grid.ravel())
    return Layout(grid=grid, unused=unused,
                  step_s=float(evaluate(top, model, grid[None], cost).step_s[0]))


def random_layouts(top: Topology, model: ModelProfile, dp: int, pp: int, count: int, seed: int,
                   cost: CostConfig = CostConfig()) -> list[Layout]:
    """`count` random placements of the shape dp x pp (each with its own sync choice)."""
    rng = np.random.default_rng(seed)
    return [layout_of(top, construct.random_layout(top, dp, pp, rng), model, cost)
            for _ in range(count)]


def greedy_layout(top: Topology, model: ModelProfile, dp: int, pp: int,
                  cost: CostConfig = CostConfig()) -> Layout:
    """Devices by region and name, filled stage after stage, in the shape dp x pp."""
    return layout_of(top, construct.greedy_layout(top, dp, pp), model, cost)
