"""Byzantine-robust rules that combine the workers' gradients of one step.

The plain mean lets a single worker move the step anywhere it likes. These
rules bound what a minority can do between audits; every replica runs them
on the same gathered inputs, so they must give the same bits everywhere:
sums over workers go in rank order, sorts are stable, norms are exact sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from shoal.spec.job import Aggregation

# Robust rules need an honest majority of at least two out of three: with fewer
# participants one cheat is half the vote, and no rule can tell which half lies.
MIN_WORKERS = 3
CENTERED_CLIP_ITERATIONS = 3
# distance_filter keeps workers within this many times the median worker's distance
# from the coordinate-wise median: honest workers differ by sampling noise, which
# varies little between them (a worker with a quarter of another's share is about
# twice as far).
FILTER_RADIUS = 2.0
_ROW = 8192  # norms sum fixed rows, so the result does not depend on the thread count
# Up to this many workers a sorting network of element-wise min/max orders each
# coordinate (a few passes over the gradients); torch.sort is ~20x slower for n = 4.
_NETWORK_MAX = 8


def aggregate(rule: Aggregation, contributions: Sequence[torch.Tensor],
              weights: Sequence[float]) -> torch.Tensor:
    """Combine per-worker contributions (rank order) into one mean-gradient estimate.

    `contributions[i]` is worker i's folded gradient, already weighted by its
    share of the global batch, `weights[i]` (share / global batch); the weights
    of a step sum to 1, so the plain mean is the weighted sum. Each worker is
    normalised to its own mean gradient (divided by its weight) and workers
    with an empty share take no part. With fewer than `MIN_WORKERS`
    participants every rule falls back to the share-weighted mean.
    """
    if len(contributions) != len(weights):
        raise ValueError(f"{len(contributions)} contributions but {len(weights)} weights")
    if rule is Aggregation.mean:
        return _rank_order_sum(contributions)
    present = [(x, w) for x, w in zip(contributions, weights) if w > 0]
    if len(present) < MIN_WORKERS:
        return _rank_order_sum([torch.zeros_like(contributions[0])] + [x for x, _ in present])
    dtype = contributions[0].dtype
    gradients = torch.empty(len(present), contributions[0].numel())  # (n, N), one pass
    for row, (x, w) in zip(gradients, present):
        torch.div(x.float(), w, out=row)
    if rule is Aggregation.trimmed_mean:
        out = trimmed_mean(gradients)
    elif rule is Aggregation.median:
        out = median(gradients)
    elif rule is Aggregation.centered_clip:
        out = centered_clip(gradients)
    elif rule is Aggregation.multi_krum:
        out = multi_krum(gradients, [w for _, w in present])
    elif rule is Aggregation.distance_filter:
        out = distance_filter(gradients, [w for _, w in present])
    else:
        raise ValueError(f"unknown aggregation rule {rule!r}")
    return (out + 0.0).to(dtype)  # -0.0 + 0.0 is +0.0: one zero, whichever order ties took


def trim_count(n: int) -> int:
    """How many values trimmed mean drops at each end of a coordinate: max(1, ⌊n/4⌋)."""
    return max(1, n // 4)


def trimmed_mean(gradients: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise trimmed mean of (n, N) gradients (Yin, Chen, Ramchandran and
    Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
    Rates", ICML 2018): per coordinate, drop the b largest and the b smallest values
    (b = `trim_count(n)`) and average the rest. NaN counts as +inf, so a lone NaN
    is dropped with the largest values."""
    n = gradients.shape[0]
    b = trim_count(n)
    if n - 2 * b < 1:
        raise ValueError(f"trimmed mean of {n} gradients drops {2 * b}: nothing is left")
    return _rank_order_sum(_middle(gradients, b)) / (n - 2 * b)


def median(gradients: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of (n, N) gradients (Yin et al., ICML 2018); for an even
    n the mean of the two middle values (torch.median would take the lower one, a
    bias towards the smaller side)."""
    n = gradients.shape[0]
    middle = _middle(gradients, (n - 1) // 2)
    if n % 2:
        return middle[0].clone()
    return (middle[0] + middle[1]) / 2


def centered_clip(gradients: torch.Tensor, start: torch.Tensor | None = None,
                  iterations: int = CENTERED_CLIP_ITERATIONS,
                  tau: float | None = None) -> torch.Tensor:
    """Centered clipping (Karimireddy, He and Jaggi, "Learning from History for
    Byzantine Robust Optimization", ICML 2021): v ← v + mean_i clip(x_i − v, τ),
    with clip(z, τ) = z · min(1, τ / ‖z‖).

    The paper starts from the previous step's aggregate; here the default start is
    the coordinate-wise median, because a replica that just joined or resumed does
    not hold the previous aggregate and every replica must compute the same bits.
    τ, unless given, is the median of the workers' distances from v at each
    iteration: scale-free, and with an honest majority it is an honest worker's
    distance, so honest gradients pass mostly unclipped while a cheat moves v by
    at most τ/n per iteration. A gradient whose distance is not finite (NaN, inf)
    is clipped to nothing.
    """
    v = median(gradients) if start is None else start.float().clone()
    n = gradients.shape[0]
    for _ in range(iterations):
        offsets = gradients - v  # (n, N)
        norms = _row_norms(offsets)
        radius = tau if tau is not None else _median_finite(norms)
        step = torch.zeros_like(v)
        for z, norm in zip(offsets, norms):
            if math.isfinite(norm) and norm > 0:
                step += z * min(1.0, radius / norm)
        v = v + step / n
    return v


def multi_krum(gradients: torch.Tensor, weights: Sequence[float],
               f: int | None = None) -> torch.Tensor:
    """Multi-Krum (Blanchard, El Mhamdi, Guerraoui and Stainer, "Machine Learning with
    Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017): the share-weighted
    mean of the n − f workers that `krum_choice` keeps, whole.

    Rules that work per coordinate bias every coordinate by the honest workers'
    spread; dropping whole workers leaves the kept honest workers' mean intact, so
    against one far-off cheat the step is the other workers' mean gradient.
    """
    return _weighted_mean(gradients, weights, krum_choice(gradients, f))


def krum_choice(gradients: torch.Tensor, f: int | None = None) -> list[int]:
    """The rows of (n, N) `gradients` that Multi-Krum keeps, in rank order.

    f (default `trim_count(n)`) workers are presumed Byzantine. Each worker's score is
    the sum of its squared distances to its max(1, n − f − 2) nearest other workers;
    the n − f lowest scores are kept, ties to the lower rank. A distance that is not
    finite (NaN, inf) counts as +inf, so a worker sending one is dropped first.
    (The paper asks n ≥ 2f + 3, five workers for one cheat; with four the nearest
    neighbour alone decides, which still leaves a far-off cheat out.)"""
    n = gradients.shape[0]
    f = trim_count(n) if f is None else f
    if not 0 <= f < n:
        raise ValueError(f"Multi-Krum of {n} gradients cannot presume {f} Byzantine")
    distances = [[0.0] * n for _ in range(n)]
    for i in range(n - 1):
        for j, square in enumerate(_row_squares(gradients[i + 1:] - gradients[i]), start=i + 1):
            distances[i][j] = distances[j][i] = square if math.isfinite(square) else math.inf
    neighbours = max(1, n - f - 2)
    scores = [sum(sorted(row[:i] + row[i + 1:])[:neighbours]) for i, row in enumerate(distances)]
    return sorted(sorted(range(n), key=lambda i: (scores[i], i))[:n - f])


def distance_filter(gradients: torch.Tensor, weights: Sequence[float],
                    radius: float = FILTER_RADIUS) -> torch.Tensor:
    """The share-weighted mean of the workers whose distance from the coordinate-wise
    median is at most `radius` times the median of those distances (a worker with a
    distance that is not finite is dropped); the median itself if none is left.

    Like Multi-Krum it drops whole workers, so against a far-off cheat the step is
    the others' mean; unlike it, it drops no honest worker when nobody is far off.
    A cheat that stays inside the radius is kept and moves the step by about its
    share times `radius` honest distances at most.
    """
    centre = median(gradients)
    distances = _row_norms(gradients - centre)
    bound = radius * _median_finite(distances)
    kept = [i for i, d in enumerate(distances) if math.isfinite(d) and d <= bound]
    return _weighted_mean(gradients, weights, kept) if kept else centre


def _weighted_mean(gradients: torch.Tensor, weights: Sequence[float],
                   kept: Sequence[int]) -> torch.Tensor:
    """Σ_{i ∈ kept} w_i g_i / Σ_{i ∈ kept} w_i, summed in rank order."""
    total = math.fsum(weights[i] for i in kept)
    return _rank_order_sum([gradients[i] * (weights[i] / total) for i in kept])


def _middle(gradients: torch.Tensor, b: int) -> list[torch.Tensor]:
    """Per coordinate, the values of (n, N) `gradients` left when the b smallest and the
    b largest are dropped, NaN as +inf: sorted, except that two are in no given order.

    Element-wise min and max are exact, so every replica gets the same bits; what
    reads two values only adds them, and a + b is b + a to the bit."""
    rows = list(torch.nan_to_num(gradients, nan=math.inf, posinf=math.inf, neginf=-math.inf))
    n = len(rows)
    if n == 4 and b == 1:  # the middle two of four: the larger of the pairs' minima and
        # the smaller of their maxima (6 element-wise passes, a full sort takes 12)
        low, high = torch.minimum(rows[0], rows[1]), torch.maximum(rows[0], rows[1])
        low2, high2 = torch.minimum(rows[2], rows[3]), torch.maximum(rows[2], rows[3])
        return [torch.maximum(low, low2), torch.minimum(high, high2)]
    if n > _NETWORK_MAX:
        return list(torch.sort(torch.stack(rows), dim=0, stable=True).values[b:n - b])
    for sweep in range(n):  # odd-even transposition: n sweeps sort n rows
        for i in range(sweep % 2, n - 1, 2):
            low, high = rows[i], rows[i + 1]
            rows[i], rows[i + 1] = torch.minimum(low, high), torch.maximum(low, high)
    return rows[b:n - b]


def _rank_order_sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum in the given order, one element-wise add at a time (same bits on every replica)."""
    total = tensors[0].clone()
    for t in tensors[1:]:
        total += t
    return total


def _row_norms(z: torch.Tensor) -> list[float]:
    """‖z_i‖ of each row of (n, N) `z`, the same whatever the thread count."""
    return [math.sqrt(square) for square in _row_squares(z)]


def _row_squares(z: torch.Tensor) -> list[float]:
    """‖z_i‖² of each row of (n, N) `z`, the same whatever the thread count: float64
    sums of fixed blocks (each summed by one thread), then an exact sum of those."""
    n, size = z.shape
    whole = size - size % _ROW
    blocks = z[:, :whole].reshape(n, -1, _ROW).square().sum(dim=2, dtype=torch.float64)
    rest = z[:, whole:].square().sum(dim=1, dtype=torch.float64)  # fewer than _ROW each
    return [math.fsum([*row, tail]) for row, tail in zip(blocks.tolist(), rest.tolist())]


def _median_finite(values: list[float]) -> float:
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return 0.0
    middle = len(finite) // 2
    return finite[middle] if len(finite) % 2 else (finite[middle - 1] + finite[middle]) / 2
