"""Errors of the built-in jobs, each with a message that says what to do."""

from shoal import ShoalError


class JobError(ShoalError):
    """A built-in job cannot be set up."""


class CorpusError(JobError):
    """The corpus is missing, empty or too small for the model's context."""
