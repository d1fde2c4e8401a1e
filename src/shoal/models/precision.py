"""The job's numeric precision as a context for the forward pass."""

from __future__ import annotations

import contextlib

import torch

from shoal.spec import Precision


def forward_precision(precision: Precision) -> contextlib.AbstractContextManager:
    """bf16: autocast the forward pass (parameters and gradients stay float32)."""
    if precision is Precision.bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()
