"""Errors of the coordinator's service, each mapped to one HTTP status at the API edge."""

from shoal.errors import ControlError


class NotFound(ControlError):
    """The job, agent or offer named does not exist (404)."""


class Forbidden(ControlError):
    """The signer's role or ownership does not allow this change (403)."""


class Conflict(ControlError):
    """The change contradicts the state it would apply to (409)."""


class Gone(ControlError):
    """What was asked for was there once and is no longer to be had (410): a challenge
    raised after its epoch's window closed."""


class RateLimited(ControlError):
    """The caller sent more than its quota allows (429): nothing was done; ask again after
    `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
