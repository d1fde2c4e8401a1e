"""First layouts for the search, and the naive layouts it is compared with.

In the spirit of DT-FM's scheduler: cut the devices into balanced groups
of nearby devices, order groups as an open path (nearest neighbour, then
2-opt), and pair each stage's devices with their nearest in the next stage.
Two duals are built, since which one wins depends on the network: stage
groups kept tight (cheap all-reduce) or pipelines kept tight (cheap
activations; the exchange across them can go local, DiLoCo style). Where
devices must sit out, pipelines are also built whole inside regions, so
that who sits out does not force pipelines across slow links.
"""

from __future__ import annotations

import numpy as np

from shoal.plan.cluster import Topology


def used_devices(top: Topology, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The `count` devices to use (the fastest, then the largest) and the rest, unused."""
    order = np.lexsort((-top.memory_bytes, -top.flops))  # last key sorts first
    return np.sort(order[:count]), np.sort(order[count:])


def balanced_groups(dist: np.ndarray, members: np.ndarray, size: int) -> list[np.ndarray]:
    """Cut `members` into groups of `size` devices near one another.

    Greedy growth: the unplaced device farthest from the rest seeds a group
    (outliers first, while they still have neighbours to choose from) and
    takes its `size - 1` nearest unplaced devices.
    """
    free = np.ones(len(members), dtype=bool)
    sub = dist[np.ix_(members, members)]
    sub = np.minimum(sub, sub.T)  # a group's links are used both ways
    spread = sub.sum(axis=1)  # distance to every unplaced device, kept up to date
    groups = []
    while free.any():
        left = np.flatnonzero(free)
        seed = left[np.argmax(spread[left])]
        near = left[np.argsort(sub[seed, left], kind="stable")][:size]
        free[near] = False
        spread -= sub[:, near].sum(axis=1)
        groups.append(members[near])
    return groups


def open_path(edge: np.ndarray, bottleneck_weight: float = 0.0, starts: int = 8) -> list[int]:
    """An order of k nodes, short as an open path: nearest neighbour from a few starts, then 2-opt.

    The path's cost is the sum of its edges plus `bottleneck_weight` times
    its longest edge (a pipeline is paced by its slowest link). Links carry
    activations one way and gradients the other, so each edge counts both ways.
    """
    k = len(edge)
    if k <= 2:
        return list(range(k))
    edge = (edge + edge.T) / 2

    def cost(order: list[int]) -> float:
        hops = edge[order[:-1], order[1:]]
        return float(hops.sum() + bottleneck_weight * hops.max())

    rows = edge.tolist()  # plain lists: these loops index single edges, thousands of times
    first = np.linspace(0, k - 1, min(k, starts)).astype(int)
    best = min((_nearest_neighbour(rows, int(start)) for start in first), key=cost)
    return _two_opt(rows, best, cost, bottleneck_weight > 0)


def _two_opt(edge: list[list[float]], order: list[int], cost, needs_full: bool) -> list[int]:
    """Reverse segments while that shortens the path (a sum of edges changes only at the cut
    ends, so without a bottleneck term each try is O(1))."""
    k, improved = len(order), True
    while improved:
        improved = False
        for i in range(k - 1):
            for j in range(i + 2, k + 1):
                if needs_full:
                    candidate = order[:i] + order[i:j][::-1] + order[j:]
                    gain = cost(order) - cost(candidate)
                else:
                    before = (edge[order[i - 1]][order[i]] if i else 0.0) + \
                        (edge[order[j - 1]][order[j]] if j < k else 0.0)
                    after = (edge[order[i - 1]][order[j - 1]] if i else 0.0) + \
                        (edge[order[i]][order[j]] if j < k else 0.0)
                    gain = before - after
                if gain > 1e-12:
                    order = order[:i] + order[i:j][::-1] + order[j:]
                    improved = True
    return order


def _nearest_neighbour(edge: list[list[float]], start: int) -> list[int]:
    order, free = [start], [i for i in range(len(edge)) if i != start]
    while free:
        row = edge[order[-1]]
        nxt = min(free, key=row.__getitem__)  # the first of equals, as argmin takes
        order.append(nxt)
        free.remove(nxt)
    return order


def align(link_s: np.ndarray, upper: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """`lower` reordered so that lower[r] is a near partner of upper[r].

    Greedy for the slowest pair: the device whose best partner is farthest
    chooses first, each taking its nearest partner still free.
    """
    times = link_s[np.ix_(upper, lower)].copy()
    result = np.empty_like(lower)
    for u in np.argsort(-times.min(axis=1), kind="stable").tolist():
        v = int(np.argmin(times[u]))
        result[u] = lower[v]
        times[:, v] = np.inf
    return result


def ordered_stages(groups: list[np.ndarray], link_s: np.ndarray, micro_batches: int) -> np.ndarray:
    """(pp, dp) grid: stage groups in open-path order, each aligned to the one before."""
    k = len(groups)
    edge = np.zeros((k, k))
    for a in range(k):
        for b in range(a + 1, k):
            # Each device's nearest partner in the other group: a cheap lower bound
            # of the best pairing's slowest link, which `align` then approaches.
            times = link_s[np.ix_(groups[a], groups[b])]
            edge[a, b] = edge[b, a] = max(times.min(axis=1).max(), times.min(axis=0).max())
    rows = [groups[i] for i in open_path(edge, bottleneck_weight=micro_batches / 2)]
    for j in range(1, k):
        rows[j] = align(link_s, rows[j - 1], rows[j])
    return np.array(rows)


def tight_stages(top: Topology, members: np.ndarray, dp: int, pp: int, exchange_bytes: float,
                 message_bytes: float, micro_batches: int) -> np.ndarray:
    """Stage groups of nearby devices (cheap exchange), ordered and aligned."""
    groups = balanced_groups(top.message_s(exchange_bytes), members, dp)
    return ordered_stages(groups, top.message_s(message_bytes), micro_batches)


def tight_pipelines(top: Topology, members: np.ndarray, dp: int, pp: int, message_bytes: float,
                    paths: dict | None = None) -> np.ndarray:
    """Pipelines of nearby devices (cheap activations), each an open path; columns of the grid
    (`paths`: orders already found, see _columns)."""
    link_s = top.message_s(message_bytes)
    return _columns(link_s, balanced_groups(link_s, members, pp), paths)


def regional_pipelines(top: Topology, dp: int, pp: int, message_bytes: float,
                       paths: dict | None = None) -> np.ndarray:
    """Pipelines each inside one region where the regions hold whole ones, fastest first,
    the rest from the fastest devices left; columns of the grid.

    Unlike the other constructions it chooses which devices sit out: when dp x pp
    is short of the cluster, the fastest dp x pp may leave every region a few
    devices short of a pipeline, so that pipelines must cross slow links.
    """
    link_s = top.message_s(message_bytes)
    regions = np.array(top.regions)
    pipelines = []
    for region in sorted(set(top.regions)):
        members = np.flatnonzero(regions == region)
        whole = len(members) // pp * pp
        if whole:
            fastest = members[np.argsort(-top.flops[members], kind="stable")][:whole]
            pipelines += balanced_groups(link_s, np.sort(fastest), pp)
    # The slowest device paces a pipeline's stages, its slowest link their transfers.
    pipelines.sort(key=lambda p: (-top.flops[p].min(), link_s[np.ix_(p, p)].max()))
    chosen = pipelines[:dp]
    if len(chosen) < dp:
        placed = np.concatenate(chosen) if chosen else np.array([], dtype=np.int64)
        left = np.setdiff1d(np.arange(top.size), placed)
        left = left[np.argsort(-top.flops[left], kind="stable")][: (dp - len(chosen)) * pp]
        chosen += balanced_groups(link_s, np.sort(left), pp)
    return _columns(link_s, chosen, paths)


def _columns(link_s: np.ndarray, pipelines: list[np.ndarray],
             paths: dict[tuple[int, ...], np.ndarray] | None = None) -> np.ndarray:
    """(pp, dp) grid whose columns are `pipelines`, each ordered as a short open path.
    `paths` keeps the orders found, by device set: constructions of one shape share
    most pipelines, and ordering them is most of their time on large clusters."""
    paths = {} if paths is None else paths
    columns = []
    for pipeline in pipelines:
        key = tuple(sorted(pipeline.tolist()))
        if key not in paths:
            pp = len(pipeline)
            order = open_path(link_s[np.ix_(pipeline, pipeline)], starts=2) if pp <= 32 \
                else range(pp)
            paths[key] = pipeline[list(order)]
        columns.append(paths[key])
    return np.array(columns).T


def speed_stages(top: Topology, members: np.ndarray, dp: int, pp: int, message_bytes: float,
                 micro_batches: int) -> np.ndarray:
    """Stage groups of devices of like speed (a slow device then slows only its own stage)."""
    by_speed = members[np.lexsort((np.array(top.regions)[members], -top.flops[members]))]
    groups = [by_speed[j * dp:(j + 1) * dp] for j in range(pp)]
    return ordered_stages(groups, top.message_s(message_bytes), micro_batches)


def greedy_layout(top: Topology, dp: int, pp: int) -> np.ndarray:
    """The naive layout: devices by region and name, filled stage after stage."""
    members, _ = used_devices(top, dp * pp)
    regions, names = np.array(top.regions), np.array(top.names)
    ordered = members[np.lexsort((names[members], regions[members]))]
    return ordered.reshape(pp, dp)


def random_layout(top: Topology, dp: int, pp: int, rng: np.random.Generator) -> np.ndarray:
    """Any dp * pp devices in any places."""
    return rng.permutation(top.size)[: dp * pp].reshape(pp, dp)
