"""Random sketches of exchanged tensors: what binds the part each member sent
to an all-reduce (which shows only the sum) to what it committed.

The directions are rows of random signs drawn from the hash of the exchanged
sum, so nobody knows them while choosing what to send: a difference between
what a member sent and what it declares shows in each row with probability
one, up to the tolerance (a relative difference d passes one row with
probability about tolerance / d, all ROWS rows about its ROWS-th power).
Sketches are linear, so the members' sketches add up to the sum's.
"""

from __future__ import annotations

import hashlib
import math
import threading

import numpy as np
import torch

ROWS = 4
_CHUNK = 1024  # values summed in float32 before the float64 sum across chunks


def sum_seed(tensors: list[torch.Tensor]) -> str:
    """SHA-256 of the exchanged sum's bytes (identical on every member after an
    all-reduce): the seed of the step's directions."""
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def sketch(seed: str, *vectors: list[torch.Tensor]) -> list[tuple[float, ...]]:
    """Each vector (a list of tensors, flattened and concatenated in order) projected
    on the ROWS sign rows drawn from `seed`; the rows are drawn once for all of them."""
    sizes = [sum(t.numel() for t in v) for v in vectors]
    if len(set(sizes)) != 1:
        raise ValueError(f"sketched vectors differ in length: {sizes}")
    padded = sizes[0] + -sizes[0] % _CHUNK  # whole chunks; the zeros past the end add nothing
    ones, x = _workspace(padded, len(vectors))
    for row, vector in zip(x, vectors):
        at = 0
        for t in vector:
            row[at:at + t.numel()] = t.detach().reshape(-1)
            at += t.numel()
        row[at:].zero_()
    rng = np.random.default_rng(int(seed[:32], 16))
    ones.copy_(torch.from_numpy(
        np.unpackbits(np.frombuffer(rng.bytes(ROWS * padded // 8), np.uint8)).reshape(ROWS, padded)))
    # A sign row times x is 2 * (the sum of x where the row is 1) - the sum of x. Sums
    # in float32 over chunks, then in float64 across them: 3e-7 from exact at a million
    # values (float32 throughout: 7e-6, too near what a cheat could hide under).
    partial = torch.bmm(ones.view(ROWS, -1, _CHUNK).transpose(0, 1),
                        x.view(len(vectors), -1, _CHUNK).permute(1, 2, 0))
    values = 2 * partial.to(torch.float64).sum(0) - x.to(torch.float64).sum(1)
    return [tuple(values[:, i].tolist()) for i in range(len(vectors))]


Sketch = tuple[float | None, ...]  # None where a value is not finite (a NaN step's)


def finite(values: tuple[float, ...]) -> Sketch:
    """A sketch as records carry it (JSON has no NaN)."""
    return tuple(v if math.isfinite(v) else None for v in values)


def mismatch(expected: Sketch, got: Sketch) -> float:
    """Relative l2 distance between two sketches: inf if their lengths differ or one is
    not finite where the other is; otherwise over the finite entries (0 if both are
    zero). A replay of a NaN step is NaN where the worker's was."""
    if len(expected) != len(got) or any((a is None) != (b is None) for a, b in zip(expected, got)):
        return math.inf
    pairs = [(a, b) for a, b in zip(expected, got) if a is not None and b is not None]
    difference = math.dist([a for a, _ in pairs], [b for _, b in pairs])
    scale = max(math.hypot(*(a for a, _ in pairs)), math.hypot(*(b for _, b in pairs)))
    return 0.0 if difference == 0.0 else difference / scale if scale > 0 else math.inf


def adds_up(parts: list[Sketch], total: Sketch, rtol: float) -> bool:
    """Do the members' sketches sum to the sketch of the exchanged sum, up to `rtol`
    of their sizes (the all-reduce adds in another order than this sum)?"""
    if any(v is None for part in parts for v in part) or any(v is None for v in total):
        return False
    if any(len(part) != len(total) for part in parts):
        return False
    summed = [math.fsum(part[i] for part in parts) for i in range(len(total))]
    scale = math.hypot(*total) + sum(math.hypot(*part) for part in parts)
    return math.dist(summed, total) <= rtol * scale


_local = threading.local()


def _workspace(padded: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sign rows and the vectors' buffer for this length, kept from call to call (per
    thread): fresh megabytes each step are page faults on first touch, which cost these
    VMs more than the sketch's arithmetic."""
    key = (padded, count)
    if getattr(_local, "key", None) != key:
        _local.key = key
        _local.buffers = (torch.empty(ROWS, padded), torch.empty(count, padded))
    return _local.buffers
