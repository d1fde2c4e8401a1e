"""Errors of the control plane (launcher, membership authority, chaos
schedules), each with a message that says what to do."""

from shoal import ShoalError


class ControlError(ShoalError):
    """A run cannot be launched, supervised or finished."""
