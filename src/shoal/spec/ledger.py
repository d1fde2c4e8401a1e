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
    """Constructor settings of a market contract; fixed for its lifetime.

    The defaults are meant for real money; a configuration in which a cheat
    could come out ahead is refused here and again by the contract.
    """

    fee_bps: int = Field(0, ge=0, le=BPS)  # operator fee on top of providers' pay
    # Share of a slash to the whistleblower: above 0 so someone reports, below
    # the whole so a cheat that reports itself still loses stake.
    whistleblower_bps: int = Field(5_000, ge=1, le=BPS - 1)
    # Least collateral a lease locks (a lease locks price x term if more).
    min_stake_wei: int = Field(10**16, ge=1)
    # Bond to open a dispute; a false one forfeits it to the treasury. The
    # floor is about the gas a referee spends rejecting it (100k gas at 1 gwei).
    min_bond_wei: int = Field(10**15, ge=10**14)
    # Whole seconds (the chain's clock has no finer unit).
    unbonding_delay_s: int = Field(7 * 24 * 3600, ge=0)
    silence_timeout_s: int = Field(24 * 3600, ge=1)  # operator silence before the submitter may reclaim
    dispute_window_s: int = Field(24 * 3600, ge=1)  # after settlement, before pay is released
    dispute_timeout_s: int = Field(3 * 24 * 3600, ge=1)  # referee silence before a dispute expires


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
    owed_wei: Wei  # booked work of unslashed leases
    fee_wei: Wei  # operator fee reserved on owed_wei, paid per lease as it is paid
    epochs: int = Field(ge=0)  # anchored epochs
    last_active: int = Field(ge=0)  # chain time of the operator's last action
    settled_at: int = Field(ge=0)  # 0 while open


class Lease(Frozen):
    """One provider's lease on a job; `unpaid` is False once paid (earnings credited) or never opened."""

    job: int = Field(ge=1)
    provider: Address
    unpaid: bool
    price_wei_per_s: Wei
    term_s: int = Field(ge=0)  # most seconds it can be billed for
    verified_s: int = Field(ge=0)  # booked so far
    accepted_at: int = Field(ge=0)  # chain time the provider accepted; 0 if not yet
    next_epoch: int = Field(ge=0)  # work is booked once per epoch, in order: the next it may be
    disputed: bool
    slashed: bool

    @property
    def earned_wei(self) -> int:
        return 0 if self.slashed else self.price_wei_per_s * self.verified_s

    def booked_for(self, epoch: int) -> bool:
        """Whether this lease's work for `epoch` (or a later one) is already booked."""
        return self.next_epoch > epoch


class LeaseAcceptance(Frozen):
    """A provider's EIP-712 signature agreeing to one lease's terms.

    The operator sends it with `open_accepted_leases`, so the provider needs
    no transaction of its own; it is bound to one contract on one chain, one
    job and these terms, and void after `deadline` (chain time).
    """

    job: int = Field(ge=1)
    provider: Address
    price_wei_per_s: int = Field(ge=1)
    term_s: int = Field(ge=1)
    deadline: int = Field(ge=0)
    v: int = Field(ge=27, le=28)
    r: Hash32
    s: Hash32


class Stake(Frozen):
    provider: Address
    active_wei: Wei  # staked and not unbonding, locked part included
    locked_wei: Wei  # collateral of accepted, unpaid leases
    unbonding_wei: Wei
    release_at: int = Field(ge=0)  # chain time when unbonding stake can be released


class DisputeState(int, enum.Enum):
    open = 1
    upheld = 2
    rejected = 3
    expired = 4
    superseded = 5  # the lease was slashed on other evidence; bond returned


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
    item: int = Field(0, ge=0)  # position in a batch event (one log, a record per provider)
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
