"""Errors of the coordinator's store."""

from shoal.errors import ControlError


class StoreError(ControlError):
    """The store cannot be opened, migrated or written."""
