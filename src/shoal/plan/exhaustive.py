"""Exhaustive search: every layout of a small cluster, judged by the same cost model.

The reference that the planner's search is measured against. Replicas are
interchangeable, so only layouts whose first stage lists its devices in
increasing order are judged (a dp! saving); the order of unused devices
does not matter either.
"""

from __future__ import annotations

import itertools

import numpy as np

from shoal.plan.cluster import Topology
from shoal.plan.cost import CostConfig, evaluate
from shoal.plan.errors import ModelDoesNotFit, PlanError
from shoal.plan.search import Layout, shapes
from shoal.spec.plan import ModelProfile

MAX_DEVICES = 8
CHUNK = 8192  # layouts judged at once


def exhaustive(top: Topology, model: ModelProfile, cost: CostConfig = CostConfig()) -> Layout:
    """The optimal layout of a cluster of at most MAX_DEVICES devices."""
    if top.size > MAX_DEVICES:
        raise PlanError(f"exhaustive search takes at most {MAX_DEVICES} devices, "
                        f"not {top.size}; use the planner's search")
    best: Layout | None = None
    for dp, pp in shapes(top, model):
        grids = _layouts(top.size, dp, pp)
        for start in range(0, len(grids), CHUNK):
            chunk = grids[start:start + CHUNK]
            step = evaluate(top, model, chunk, cost).step_s
            pick = int(np.argmin(step))
            if np.isfinite(step[pick]) and (best is None or step[pick] < best.step_s):
                grid = chunk[pick]
                unused = np.setdiff1d(np.arange(top.size), grid.ravel())
                best = Layout(grid=grid.copy(), unused=unused, step_s=float(step[pick]))
    if best is None:
        need = model.parameters * model.state_bytes_per_parameter / 1e9
        raise ModelDoesNotFit(model.name, need, float(top.memory_bytes.sum()) / 1e9)
    return best


def _layouts(n: int, dp: int, pp: int) -> np.ndarray:
    """(K, pp, dp) every placement of dp * pp of n devices, up to the order of replicas."""
    used = dp * pp
    rows = []
    for chosen in itertools.combinations(range(n), used):
        for perm in itertools.permutations(chosen):
            if dp == 1 or all(perm[i] < perm[i + 1] for i in range(dp - 1)):
                rows.append(perm)
    return np.array(rows, dtype=np.int64).reshape(-1, pp, dp)
