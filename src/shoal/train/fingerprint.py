"""A cheap fingerprint of a replica's parameters, exchanged with every step.

Hashing every parameter (`param_sha256`) costs a pass over the model, too
much for every step. Instead each step hashes a fixed strided sample of
each tensor (at most `SAMPLES_PER_TENSOR` elements), so replicas that
drifted apart are caught at the step where it happened. A divergence
confined to unsampled elements goes unseen until the next full check;
optimizer updates touch every element, so it rarely stays confined.
"""

from __future__ import annotations

import hashlib

import torch

SAMPLES_PER_TENSOR = 256
_MASK24 = (1 << 24) - 1  # float32 holds integers below 2**24 exactly


def fingerprint(params: list[torch.Tensor]) -> tuple[int, int]:
    """48 bits of a hash of sampled parameter values, as two 24-bit integers."""
    digest = hashlib.blake2b(digest_size=6)
    with torch.no_grad():
        for p in params:
            flat = p.detach().reshape(-1)
            stride = max(1, flat.numel() // SAMPLES_PER_TENSOR)
            sample = flat[::stride].contiguous().cpu()
            digest.update(sample.view(torch.uint8).numpy().tobytes())
    value = int.from_bytes(digest.digest(), "big")
    return value >> 24 & _MASK24, value & _MASK24
