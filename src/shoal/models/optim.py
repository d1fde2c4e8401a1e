"""Optimizer and learning-rate schedule from the job spec.

The schedule is a pure function of the step, so a resumed run sets the
same learning rate as an uninterrupted one.
"""

from __future__ import annotations

import math

import torch

from shoal.spec import OptimizerKind, OptimizerSpec, ScheduleKind, ScheduleSpec


def build_optimizer(model: torch.nn.Module, spec: OptimizerSpec) -> torch.optim.Optimizer:
    # No weight decay on biases, norms and embeddings' 1-D params (GPT-2 practice).
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": spec.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if spec.kind is OptimizerKind.adamw:
        return torch.optim.AdamW(groups, lr=spec.lr, betas=(spec.beta1, spec.beta2), foreach=True)
    return torch.optim.SGD(groups, lr=spec.lr, momentum=spec.momentum, foreach=True)


def lr_at(step: int, total_steps: int, base_lr: float, spec: ScheduleSpec) -> float:
    """Learning rate for `step` (0-based) of `total_steps`."""
    if step < spec.warmup_steps:
        return base_lr * (step + 1) / spec.warmup_steps
    floor = base_lr * spec.min_lr_ratio
    if spec.kind is ScheduleKind.constant:
        return base_lr
    span = max(1, total_steps - spec.warmup_steps)
    progress = min(1.0, (step - spec.warmup_steps) / span)
    if spec.kind is ScheduleKind.linear:
        return base_lr - (base_lr - floor) * progress
    return floor + 0.5 * (base_lr - floor) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
