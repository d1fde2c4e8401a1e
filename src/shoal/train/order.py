"""The data order: which samples each step, and each share of a step, uses.

Samples are addressed by their position in an endless stream: position p
belongs to pass p // N over the data, and maps to sample id perm_pass[p % N]
(a permutation seeded by the job seed and the pass). A cursor advances by
the global batch each step, so the order does not depend on how many
workers there are or how the batch is split: no sample is skipped or seen
twice across membership changes. Pure numpy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np


def step_cursor(step: int, global_batch: int) -> int:
    """Stream position of the first sample of `step` (the global batch is fixed per job)."""
    return step * global_batch


def split_shares(global_batch: int, weights: list[float] | int, min_share: int = 0) -> tuple[int, ...]:
    """Split a global batch into per-worker shares proportional to `weights`.

    An int means that many equal workers. The split is by weight with
    largest-remainder rounding, ties to the lower index; then any worker below
    `min_share` (when the batch allows every worker that much) is raised to it,
    one sample at a time from the largest share (ties to the lower index). A
    floor added on top of every share instead would hand the slowest worker more
    than its speed warrants and make everyone wait for it. Every worker computes
    the same split from the same inputs.
    """
    if isinstance(weights, int):
        weights = [1.0] * weights
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"share weights must be non-negative with a positive sum, got {weights}")
    total = float(sum(weights))
    exact = [global_batch * w / total for w in weights]
    shares = [int(x) for x in exact]
    left = global_batch - sum(shares)
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[:left]:
        shares[i] += 1
    floor = min_share if global_batch >= min_share * len(weights) else 0
    for i in range(len(shares)):
        while shares[i] < floor:
            donor = max(range(len(shares)), key=lambda j: (shares[j], -j))
            shares[donor] -= 1
            shares[i] += 1
    return tuple(shares)


def share_positions(cursor: int, shares: tuple[int, ...], k: int) -> range:
    """Stream positions used by share k of a step that starts at `cursor`."""
    start = cursor + sum(shares[:k])
    return range(start, start + shares[k])


@dataclass(frozen=True)
class DataOrder:
    """Seeded permutation over `num_samples` training windows, pass after pass."""

    num_samples: int
    seed: int
    _permutation: object = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_samples <= 0:
            raise ValueError("DataOrder needs at least one sample")
        num, seed = self.num_samples, self.seed
        # A small cache: a step touches at most two passes.
        cached = lru_cache(maxsize=4)(lambda p: _permutation(num, seed, p))
        object.__setattr__(self, "_permutation", cached)

    def sample_ids(self, positions: range | np.ndarray) -> np.ndarray:
        """Sample ids (int64) at the given stream positions."""
        positions = np.asarray(positions, dtype=np.int64)
        passes = positions // self.num_samples
        ids = np.empty_like(positions)
        for p in np.unique(passes):
            mask = passes == p
            ids[mask] = self._permutation(int(p))[positions[mask] % self.num_samples]
        return ids

    def step_samples(self, step: int, global_batch: int, shares: tuple[int, ...] | None = None,
                     k: int = 0) -> np.ndarray:
        """Sample ids of share k of `step` (the whole step if `shares` is None)."""
        shares = shares or (global_batch,)
        return self.sample_ids(share_positions(step_cursor(step, global_batch), shares, k))


def _permutation(num_samples: int, seed: int, pass_index: int) -> np.ndarray:
    generator = np.random.Generator(np.random.PCG64([seed, pass_index]))
    return generator.permutation(num_samples)
