"""Settlement on an EVM chain: escrow, stakes, work anchors, payment, slashing.

The chain holds money and commitments only (hashes, counts, wei). This
package ships the compiled contract and a typed client for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from shoal.ledger.errors import (
    ArtifactError,
    ChainUnavailable,
    ContractRevert,
    InsufficientFunds,
    InvalidInput,
    InvalidState,
    LedgerError,
    OutsideTimeWindow,
    Unauthorized,
)

if TYPE_CHECKING:
    from shoal.ledger.chain import Chain, ChainKind
    from shoal.ledger.market import GAS_LIMITS, Ledger
    from shoal.ledger.transact import Sender

# The chain client pulls in web3 and eth-account (1.5 s of imports on these machines):
# loaded on first use, so that every `shoal` command that never touches a chain (and
# each job host and worker the CLI starts) does not pay for it.
_LAZY = {"Chain": "chain", "ChainKind": "chain", "GAS_LIMITS": "market", "Ledger": "market",
         "Sender": "transact"}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'shoal.ledger' has no attribute {name!r}")
    return getattr(importlib.import_module(f"shoal.ledger.{_LAZY[name]}"), name)


__all__ = [
    "GAS_LIMITS",
    "ArtifactError",
    "Chain",
    "ChainKind",
    "ChainUnavailable",
    "ContractRevert",
    "InsufficientFunds",
    "InvalidInput",
    "InvalidState",
    "Ledger",
    "LedgerError",
    "Sender",
    "OutsideTimeWindow",
    "Unauthorized",
]
