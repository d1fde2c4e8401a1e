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
        # The array's buffer, hashed in place: .tobytes() would copy every parameter first
        # (hashes run at every step with work records, and at every re-taken audit step).
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def optimizer_state_sha256(state: dict) -> str:
    """SHA-256 over an optimizer's per-parameter state (`state_dict()["state"]`: Adam's
    moments and step counts), in parameter then name order. Hyperparameters are not in
    it: a verifier takes them from the job, never from a worker."""
    digest = hashlib.sha256(b"shoal-optimizer-state-v1")
    for index in sorted(state):
        digest.update(f"\x00{index}".encode())
        for name in sorted(state[index]):
            value = state[index][name]
            digest.update(f"\x00{name}".encode())
            if isinstance(value, torch.Tensor):
                tensor = value.detach().contiguous().cpu()
                digest.update(f":{tuple(tensor.shape)}:{tensor.dtype}:".encode())
                digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
            else:
                digest.update(f":{value!r}".encode())
    return digest.hexdigest()
