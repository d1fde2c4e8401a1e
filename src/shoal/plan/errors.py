"""Errors of the planner: a cluster or model it cannot read, a model that fits nowhere.

Each message names what is wrong and what to change; the CLI prints it as one line.
"""

from __future__ import annotations

from shoal import ShoalError


class PlanError(ShoalError):
    """Root of the planner's errors."""


class InvalidCluster(PlanError):
    """A cluster description that is malformed or inconsistent."""


class UnknownModel(PlanError):
    """A model that is neither a preset nor a readable profile."""


class ModelDoesNotFit(PlanError):
    """No layout of the cluster holds the model in its devices' memory."""

    def __init__(self, model: str, need_gb: float, have_gb: float) -> None:
        super().__init__(
            f"no layout of this cluster holds model '{model}' (about {need_gb:.1f} GB of weights "
            f"and optimizer state; the devices have {have_gb:.1f} GB together, and each stage "
            "must fit its smallest device); add devices or memory, or plan a smaller model"
        )
