"""What a carried checkpoint must agree with besides its parameters: the parts of a
worker's state that follow from the job and the step alone. A checkpoint restores
every worker of the job at once, so a part left to its sender's word is one provider
steering all the others (a shifted data cursor makes every honest record name the
wrong samples, which an audit then blames on the honest workers).

Checked here: the data cursor (the data order is exact: `shoal.train.order`), and
the optimizer's settings the job file fixes, and that it covers the model's
parameters once each. Still the sender's word, because nothing the coordinator
holds derives them (no work record commits to them; only a replay of every step
since the start would): the optimizer's moments (values and shapes: which
parameter each index is depends on the job's grouping, `shoal.models.optim`, a layer
above this one) and step counts, the RNG state, the guard's loss history, the share
balancer's base world and the sync extras (DiLoCo's outer state). The writer seat
bounds who may say them.
"""

from __future__ import annotations

from typing import Any

import torch

from shoal.coordinator.errors import Conflict
from shoal.spec import OptimizerKind
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec
from shoal.train.order import step_cursor

# Set by the job's schedule before every optimizer step (`lr_at`), so never restored in
# effect; weight decay differs by group (none on 1-D parameters) and is checked apart.
_PER_GROUP = ("params", "lr", "weight_decay")


def check_cursor(spec: JobSpec, step: int, state: dict[str, Any]) -> None:
    """The data cursor of a checkpoint of `step` is where step `step` starts, nothing else."""
    expected = step_cursor(step, spec.global_batch)
    if state["cursor"] != expected:
        raise Conflict(f"the checkpoint's data cursor is {state['cursor']}; step {step} of this "
                       f"job starts at stream position {expected} (step × global_batch "
                       f"{spec.global_batch}): refused, it would move every worker off the "
                       "job's data order")


def check_optimizer(spec: JobSpec, state: dict[str, Any], model: torch.nn.Module) -> None:
    """The optimizer state covers the job's model, with the settings its job file sets."""
    optimizer = state.get("optimizer")
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("param_groups"), list) \
            or not isinstance(optimizer.get("state"), dict):
        raise SpecError("the checkpoint has no optimizer state a worker wrote")
    groups = optimizer["param_groups"]
    indices = sorted(i for g in groups if isinstance(g, dict) for i in g.get("params", ()))
    if indices != list(range(len(list(model.parameters())))):
        raise Conflict("the checkpoint's optimizer does not cover the job model's parameters "
                       "once each: refused")
    settings = _job_settings(spec)
    for group in groups:
        shared = (settings.keys() & group.keys()) - set(_PER_GROUP)
        differ = {k: group[k] for k in shared if _plain(group[k]) != _plain(settings[k])}
        if group.get("weight_decay") not in (spec.optimizer.weight_decay, 0.0):
            differ["weight_decay"] = group.get("weight_decay")
        if differ:
            raise Conflict(f"the checkpoint's optimizer settings {differ} are not what the "
                           "job file sets: refused, every worker would train with them")
    if not set(optimizer["state"]) <= set(indices):
        raise Conflict("the checkpoint's optimizer has state for parameters the job's model "
                       "does not have: refused")


def _job_settings(spec: JobSpec) -> dict[str, Any]:
    """Every group setting of the optimizer the job builds (`shoal.models.optim`)."""
    o = spec.optimizer
    probe = [torch.zeros(1)]
    if o.kind is OptimizerKind.adamw:
        return torch.optim.AdamW(probe, lr=o.lr, betas=(o.beta1, o.beta2), foreach=True).defaults
    return torch.optim.SGD(probe, lr=o.lr, momentum=o.momentum, foreach=True).defaults


def _plain(value: Any) -> Any:
    """Tuples and lists alike (a state dict may hold betas as either)."""
    return list(value) if isinstance(value, (tuple, list)) else value
