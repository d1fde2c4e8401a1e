"""Revert reasons, however a client words them, become the right exception."""

from __future__ import annotations

import pytest

from shoal import ShoalError
from shoal.ledger.errors import (
    ContractRevert,
    InsufficientFunds,
    InvalidInput,
    InvalidState,
    LedgerError,
    OutsideTimeWindow,
    Unauthorized,
    reason_of,
    revert_error,
)

HARDHAT = ("Error: VM Exception while processing transaction: reverted with reason string "
           "'role: only the operator may settle a job'")
PY_EVM = "execution reverted: role: only the operator may settle a job"


@pytest.mark.parametrize("message", [HARDHAT, PY_EVM])
def test_reason_is_found_in_each_clients_wording(message):
    assert reason_of(message) == "role: only the operator may settle a job"


@pytest.mark.parametrize("category, error", [
    ("role", Unauthorized), ("state", InvalidState), ("funds", InsufficientFunds),
    ("time", OutsideTimeWindow), ("input", InvalidInput), ("other", ContractRevert),
])
def test_category_picks_the_exception(category, error):
    raised = revert_error("settle", f"execution reverted: {category}: why")
    assert type(raised) is error
    assert isinstance(raised, LedgerError) and isinstance(raised, ShoalError)
    assert raised.reason == f"{category}: why"
    assert str(raised).startswith("settle reverted: ") and raised.hint in str(raised)
