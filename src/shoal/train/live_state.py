"""The live state a replica holds, as one verifiable blob: model, optimizer,
RNG, step, data cursor and guard history. A joining worker receives it from
a peer in one broadcast and checks it against the sender's SHA-256; the
same blob is what disk checkpoints hold.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shoal.train.archives import ArchiveError, check_archive


@dataclass(frozen=True)
class PackedState:
    blob: torch.Tensor  # uint8, 1-D
    sha256: str


def pack(state: dict[str, Any]) -> PackedState:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    raw = buffer.getvalue()
    blob = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
    return PackedState(blob, hashlib.sha256(raw).hexdigest())


def unpack(blob: torch.Tensor, expected_sha256: str, limit: int) -> dict[str, Any]:
    """The state in `blob`, a peer's: checked against the hash the peer announced, and as
    an archive of at most `limit` bytes that inflates nothing (shoal.train.archives)."""
    raw = blob.numpy().tobytes()
    found = hashlib.sha256(raw).hexdigest()
    if found != expected_sha256:
        raise ValueError(f"state transfer corrupted: sha256 {found[:12]} != {expected_sha256[:12]}")
    try:
        check_archive(raw, limit)
    except ArchiveError as error:
        raise ValueError(f"state transfer refused: {error}") from None
    return torch.load(io.BytesIO(raw), weights_only=True)


def state_limit(model: torch.nn.Module) -> int:
    """The most bytes a peer's live state of `model` may take: parameters, the optimizer's
    moments, a rollback's copy of both and a DiLoCo round's outer state fit in 16 times
    the parameters' bytes, and the rest (RNG, guard history, pickles) in 64 MiB."""
    return 16 * sum(p.numel() * p.element_size() for p in model.parameters()) + (64 << 20)
