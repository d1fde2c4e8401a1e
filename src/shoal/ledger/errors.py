"""Errors of the settlement layer, one class per thing the user can act on.

The contract starts every revert reason with a category ("role:", "state:",
"funds:", "time:", "input:"); `revert_error` turns a reason into the class of
that category, so callers can catch `Unauthorized` rather than parse strings.
"""

from __future__ import annotations

import re

from shoal import ShoalError


class LedgerError(ShoalError):
    """Root of the ledger's errors."""


class ArtifactError(LedgerError):
    """The shipped ABI/bytecode is missing or does not match the contract source."""


class ChainUnavailable(LedgerError):
    """The chain cannot be reached, or a transaction was not mined in time."""


class ContractRevert(LedgerError):
    """The contract refused a call; `reason` is its revert reason, verbatim.

    A reverted transaction that was mined still cost its sender gas: then
    `tx_hash` names it and `fee_wei` is what it cost (else None and 0).
    """

    hint = "check the call's arguments against the contract's rules"

    def __init__(self, function: str, reason: str) -> None:
        self.function = function
        self.reason = reason
        self.tx_hash: str | None = None
        self.fee_wei = 0
        super().__init__(f"{function} reverted: {reason} ({self.hint})")


class Unauthorized(ContractRevert):
    hint = "send it from the account that holds the role (owner, operator, referee, submitter)"


class InvalidState(ContractRevert):
    hint = "inspect the job with `shoal chain status` and follow its lifecycle"


class InsufficientFunds(ContractRevert):
    hint = "fund, stake or bond more, or ask for less"


class OutsideTimeWindow(ContractRevert):
    """Too early (a delay has not passed) or too late (a window has closed)."""

    hint = "the reason names the deadline: wait for it, or act before a window closes"


class InvalidInput(ContractRevert):
    hint = "fix the argument named in the reason"


_CATEGORIES: dict[str, type[ContractRevert]] = {
    "role": Unauthorized,
    "state": InvalidState,
    "funds": InsufficientFunds,
    "time": OutsideTimeWindow,
    "input": InvalidInput,
}

# Clients word reverts differently: py-evm "execution reverted: R", Hardhat
# "VM Exception ... reverted with reason string 'R'".
_REASON_PATTERNS = (
    re.compile(r"reverted with reason string '(?P<reason>.*)'", re.S),
    re.compile(r"execution reverted: (?P<reason>.*)", re.S),
)


def reason_of(message: str) -> str:
    """The bare revert reason inside a client's error message."""
    for pattern in _REASON_PATTERNS:
        match = pattern.search(message)
        if match:
            return match.group("reason").strip().strip("'\"")
    return message.strip()


def revert_error(function: str, message: str) -> ContractRevert:
    """The exception for a revert of `function` whose client message is `message`."""
    reason = reason_of(message)
    category = reason.split(":", 1)[0] if ":" in reason else ""
    return _CATEGORIES.get(category, ContractRevert)(function, reason)
