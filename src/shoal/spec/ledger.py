"""Values that cross the chain boundary: contract settings, escrow views, events.

Amounts are integers in wei and chain times are whole seconds since the
epoch, because that is what the contract stores; a float would lose wei.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from shoal.spec.job import Frozen

Address = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$")]
Hash32 = Annotated[str, Field(pattern=r"^0x[0-9a-f]{64}$")]
Wei = Annotated[int, Field(ge=0)]
BPS = 10_000  # basis points in one whole


class LedgerConfig(Frozen):
    """Constructor settings of a market contract; fixed for its lifetime."""

    fee_bps: int = Field(0, ge=0, le=BPS)  # operator fee on top of providers' pay
    whistleblower_bps: int = Field(5_000, ge=0, le=BPS)  # share of a slash to the whistleblower
    min_stake_wei: Wei = 0  # stake a provider needs before it can be leased
    min_bond_wei: Wei = 1  # bond to open a dispute; at least 1 wei
    # Whole seconds (the chain's clock has no finer unit).
    unbonding_delay_s: int = Field(7 * 24 * 3600, ge=0)
    silence_timeout_s: int = Field(24 * 3600, ge=0)  # operator/referee silence before fallbacks
    dispute_window_s: int = Field(3600, ge=0)  # after settlement, before payout


class JobState(str, enum.Enum):
    open = "open"
    settled = "settled"


class JobEscrow(Frozen):
    """A job's money as the contract holds it."""

    job: int = Field(ge=1)
    submitter: Address
    state: JobState
    max_price_wei_per_s: Wei
    escrow_wei: Wei  # deposited by the submitter, in total
    owed_wei: Wei  # booked verified work of unslashed leases
    epochs: int = Field(ge=0)  # anchored epochs
    last_active: int = Field(ge=0)  # chain time of the operator's last action
    settled_at: int = Field(ge=0)  # 0 while open


class Lease(Frozen):
    """One provider's lease on a job; `unpaid` is False once paid or never opened."""

    job: int = Field(ge=1)
    provider: Address
    unpaid: bool
    price_wei_per_s: Wei
    verified_s: int = Field(ge=0)
    disputed: bool
    slashed: bool

    @property
    def earned_wei(self) -> int:
        return 0 if self.slashed else self.price_wei_per_s * self.verified_s


class Stake(Frozen):
    provider: Address
    active_wei: Wei
    unbonding_wei: Wei
    release_at: int = Field(ge=0)  # chain time when unbonding stake can be released


class DisputeState(int, enum.Enum):
    open = 1
    upheld = 2
    rejected = 3
    expired = 4


class Dispute(Frozen):
    dispute: int = Field(ge=1)
    job: int = Field(ge=1)
    provider: Address
    challenger: Address
    bond_wei: Wei
    opened_at: int = Field(ge=0)
    state: DisputeState


class Anchor(Frozen):
    """The Merkle root of one epoch's work records, as anchored."""

    job: int = Field(ge=1)
    epoch: int = Field(ge=0)
    root: Hash32


class ChainEvent(Frozen):
    """One contract event: its name, where it was logged, and its arguments."""

    name: str
    block: int = Field(ge=0)
    tx_hash: Hash32
    log_index: int = Field(ge=0)
    args: dict[str, int | str | bool]


class TxOutcome(Frozen):
    """A mined, successful transaction and what it cost its sender."""

    function: str
    tx_hash: Hash32
    block: int = Field(ge=0)
    gas_used: int = Field(ge=0)
    fee_wei: Wei  # gas_used × effective gas price, paid by the sender
    events: tuple[ChainEvent, ...] = ()
    returned: int | None = None  # the new job or dispute id, where the function makes one
