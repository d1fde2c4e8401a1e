"""Settlement on an EVM chain: escrow, stakes, work anchors, payment, slashing.

The chain holds money and commitments only (hashes, counts, wei). This
package ships the compiled contract and a typed client for it.
"""

from shoal.ledger.chain import Chain, ChainKind
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
from shoal.ledger.market import GAS_LIMITS, Ledger
from shoal.ledger.transact import Sender

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
