"""Errors of the training runtime, each with a message that says what to do."""

from shoal import ShoalError


class TrainError(ShoalError):
    """Training cannot start or continue."""


class CheckpointError(TrainError):
    """No usable checkpoint where one is needed, or one from another job."""
