"""The live state a replica holds, as one verifiable blob: model, optimizer,
RNG, step, data cursor and guard history. A joining worker receives it from
a peer in one broadcast and checks it against the sender's SHA-256; the blob is
a state file (shoal.train.state_file: safetensors, never a pickle), as disk
checkpoints are.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shoal.train.state_file import StateFileError, decode, encode


@dataclass(frozen=True)
class PackedState:
    blob: torch.Tensor  # uint8, 1-D
    sha256: str


def pack(state: dict[str, Any]) -> PackedState:
    raw = encode(state)
    blob = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
    return PackedState(blob, hashlib.sha256(raw).hexdigest())


def unpack(blob: torch.Tensor, expected_sha256: str, limit: int) -> dict[str, Any]:
    """The state in `blob`, a peer's: checked against the hash the peer announced, and
    read as a state file of at most `limit` bytes."""
    raw = blob.numpy().tobytes()
    found = hashlib.sha256(raw).hexdigest()
    if found != expected_sha256:
        raise ValueError(f"state transfer corrupted: sha256 {found[:12]} != {expected_sha256[:12]}")
    try:
        state = decode(raw, limit)
    except StateFileError as error:
        raise ValueError(f"state transfer refused: {error}") from None
    if not isinstance(state, dict):
        raise ValueError("state transfer refused: the state is not a dict")
    return state


def state_limit(model: torch.nn.Module) -> int:
    """The most bytes a peer's live state of `model` may take: parameters, the optimizer's
    moments, a rollback's copy of both and a DiLoCo round's outer state fit in 16 times
    the parameters' bytes, and the rest (RNG, guard history, the header) in 64 MiB."""
    return 16 * sum(p.numel() * p.element_size() for p in model.parameters()) + (64 << 20)
