"""Hashes of model state, to compare replicas and runs bit for bit."""

from __future__ import annotations

import hashlib

import torch


def param_sha256(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter's raw bytes, in name order (shared weights once)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        tensor = param.detach().contiguous().cpu()
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
