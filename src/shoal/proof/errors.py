"""Errors of the proof layer, one class per thing a caller can act on.

Every message names the value at fault and says what to do instead; the
verifier and the CLI print them as one line.
"""

from __future__ import annotations

from shoal import ShoalError


class ProofError(ShoalError):
    """Root of the proof layer's errors."""


class EmptyTree(ProofError):
    """A Merkle tree of no leaves: there is nothing to anchor."""

    def __init__(self) -> None:
        super().__init__("a Merkle tree needs at least one leaf; "
                         "anchor an epoch only once it has records")


class DuplicateRecord(ProofError):
    """Two records of one epoch for the same (step, worker): the tree would commit to both."""

    def __init__(self, step: int, worker: str) -> None:
        super().__init__(f"two work records for step {step} of worker '{worker}'; "
                         "keep exactly one record per step and worker")
        self.step = step
        self.worker = worker


class MixedRecords(ProofError):
    """Records handed to a function that judges one job, epoch or step at a time."""


class DisputeError(ProofError):
    """A move a bisection dispute does not allow."""


class DisputeClosed(DisputeError):
    """A move after the dispute was decided (by convergence or by default)."""


class WrongQuery(DisputeError):
    """An answer for a step other than the one the dispute asks about, or a second answer."""


class ClockWentBack(DisputeError):
    """A time earlier than one the dispute was already given."""

    def __init__(self, now_s: float, last_s: float) -> None:
        super().__init__(f"time {now_s} s is before {last_s} s, already seen; "
                         "pass a clock that never goes back")
