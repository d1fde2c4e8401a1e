"""Errors of the coordinator's store."""

from shoal.control.errors import ControlError


class StoreError(ControlError):
    """The store cannot be opened, migrated or written."""
