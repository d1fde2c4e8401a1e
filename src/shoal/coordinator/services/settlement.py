"""The coordinator as the settlement contract's operator: a job's escrow is
checked on chain before it is taken, each provider's lease is opened from
the provider's own signed acceptance, and at the job's end the metered
seconds are anchored, booked and settled, so the chain pays what the store
billed and never more.

The contract holds one lease per (job, provider) and books whole seconds
that have passed since the provider accepted; the market leases devices.
A provider's devices on one job therefore share one chain lease at one
price, and each is booked from its acceptance, not from its lease's start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from functools import cached_property

from eth_account.signers.local import LocalAccount

from shoal.coordinator.errors import Conflict
from shoal.ledger import Ledger, LedgerError
from shoal.ledger.acceptance import signer_of
from shoal.spec.coordinator import AcceptanceTerms
from shoal.spec.ledger import JobEscrow, LeaseAcceptance, LedgerConfig

log = logging.getLogger(__name__)
ACCEPT_WITHIN_S = 600  # a signed acceptance is void this long after its terms were offered
BPS = 10_000  # the contract's basis points


@dataclass(frozen=True)
class Booking:
    """What settling one job booked: whole seconds and wei per provider."""

    seconds: dict[str, int]
    wei: dict[str, int]
    root: str


class Settlement:
    def __init__(self, ledger: Ledger, operator: LocalAccount) -> None:
        self.ledger, self.operator = ledger, operator

    @property
    def contract(self) -> str:
        return self.ledger.address

    @cached_property
    def config(self) -> LedgerConfig:
        """The contract's parameters: immutable, so read once."""
        return self.ledger.config()

    def escrow_needed(self, budget_wei: int) -> int:
        """Escrow that covers a budget's pay and the market's fee on top of it (`book`
        refuses work whose pay and fee the escrow cannot cover)."""
        return budget_wei + budget_wei * self.config.fee_bps // BPS

    def check_escrow(self, chain_job: int, submitter: str, budget_wei: int,
                     max_price_wei_per_s: int) -> None:
        """The job on chain is the submitter's, open, and holds the budget plus the fee on it."""
        try:
            escrow = self.ledger.job(chain_job)
        except LedgerError as error:
            raise Conflict(str(error)) from None
        if escrow.submitter.lower() != submitter.lower():
            raise Conflict(f"chain job {chain_job} belongs to {escrow.submitter}, not to you; "
                           "create your own with the contract's create_job")
        if escrow.settled_at:
            raise Conflict(f"chain job {chain_job} is settled; create a new one")
        needed = self.escrow_needed(budget_wei)
        if escrow.escrow_wei < needed:
            raise Conflict(f"chain job {chain_job} holds {escrow.escrow_wei} wei in escrow, less "
                           f"than the budget of {budget_wei} plus the market's fee of "
                           f"{self.config.fee_bps} bps on it: fund it first, to {needed} wei")
        if escrow.max_price_wei_per_s < max_price_wei_per_s:
            raise Conflict(f"chain job {chain_job} caps the price at {escrow.max_price_wei_per_s} "
                           f"wei/s, below this job's {max_price_wei_per_s}")

    def deadline(self) -> int:
        """Chain time after which terms offered now may no longer be accepted."""
        return self.ledger.chain.now() + ACCEPT_WITHIN_S

    def terms(self, chain_job: int, price_wei_per_s: int, budget_wei: int,
              deadline: int) -> AcceptanceTerms:
        """What a provider is asked to sign: the lease's price, for as long as the budget lasts."""
        return AcceptanceTerms(chain_id=self.ledger.chain.chain_id, contract=self.contract,
                               chain_job=chain_job, price_wei_per_s=price_wei_per_s,
                               term_s=max(1, math.ceil(budget_wei / price_wei_per_s)),
                               deadline=deadline)

    def open_lease(self, acceptance: LeaseAcceptance, expected: AcceptanceTerms) -> int:
        """Open the provider's chain lease from its signature, if the terms are the ones offered
        and its free stake locks their collateral; returns the chain time it was accepted.

        A lease the contract opens without locking collateral is only offered: it books
        nothing, so it is refused here (stake first), never taken as accepted."""
        offered = (expected.chain_job, expected.price_wei_per_s, expected.term_s)
        signed = (acceptance.job, acceptance.price_wei_per_s, acceptance.term_s)
        if signed != offered:
            raise Conflict(f"the acceptance is for (job, price, term) {signed}; the lease offered "
                           f"{offered}: sign the terms in the assignment")
        if signer_of(acceptance, self.ledger.chain.chain_id, self.contract) != acceptance.provider:
            raise Conflict("the acceptance is not signed by its provider for this contract")
        lease = self.ledger.lease(acceptance.job, acceptance.provider)
        if not lease.unpaid:  # no lease yet: open it only if it will lock its collateral
            self._check_free_stake(acceptance.provider, expected)
            try:
                self.ledger.open_accepted_leases(self.operator, acceptance.job, [acceptance])
            except LedgerError as error:  # a revert: deadline passed, ...
                raise Conflict(f"the chain refused the lease: {error}") from None
            lease = self.ledger.lease(acceptance.job, acceptance.provider)
        elif (lease.price_wei_per_s, lease.term_s) != offered[1:]:
            raise Conflict(f"your lease on chain job {acceptance.job} is open at other terms "
                           f"(price, term) {(lease.price_wei_per_s, lease.term_s)}; it cannot "
                           "back this lease: ask the operator")
        if lease.accepted_at == 0:  # its stake fell between the check and the open
            raise Conflict(f"your lease on chain job {acceptance.job} is open but only offered: "
                           f"your free stake cannot lock its collateral of "
                           f"{self.collateral(expected)} wei; stake more, then call the "
                           "contract's accept for this job")
        return lease.accepted_at

    def collateral(self, terms: AcceptanceTerms) -> int:
        """What the contract locks from the provider's stake for a lease on these terms."""
        return max(terms.price_wei_per_s * terms.term_s, self.config.min_stake_wei)

    def _check_free_stake(self, provider: str, terms: AcceptanceTerms) -> None:
        stake = self.ledger.stake_of(provider)
        free, needed = stake.active_wei - stake.locked_wei, self.collateral(terms)
        if free < needed:
            raise Conflict(f"your free stake of {free} wei cannot lock this lease's collateral of "
                           f"{needed} wei: stake at least {needed - free} wei more on "
                           f"{self.contract}; the lease is offered again at your next beat")

    def escrow(self, chain_job: int) -> JobEscrow:
        return self.ledger.job(chain_job)

    def keep_active(self, escrow: JobEscrow, every_s: float) -> bool:
        """Refresh the open chain job's last operator activity if it is `every_s` old (chain
        time), so its submitter cannot `reclaim` it as abandoned; whether it sent one."""
        if self.ledger.chain.now() - escrow.last_active < every_s:
            return False
        self.ledger.keep_active(self.operator, escrow.job)
        return True

    def settle(self, chain_job: int, metered_s: dict[str, int]) -> Booking:
        """Anchor the metered bill, book each provider's seconds (capped by what the chain
        allows at the anchor's block) and settle: the unspent escrow goes back.

        Safe to call again after a failure: only what the chain has not booked yet is booked."""
        accepted = {p: self.ledger.lease(chain_job, p) for p in metered_s}
        # A slashed lease is never booked (the contract would refuse the whole batch).
        accepted = {p: lease for p, lease in accepted.items()
                    if lease.accepted_at and not lease.slashed}
        prices = {p: lease.price_wei_per_s for p, lease in accepted.items()}
        root = _bill_root(chain_job, {p: metered_s[p] for p in accepted}, prices)
        epoch = self.ledger.job(chain_job).epochs
        self.ledger.anchor(self.operator, chain_job, epoch, root)
        now = self.ledger.chain.now()  # the anchor's block: as fresh as the chain's clock gets
        seconds = {p: min(metered_s[p], lease.term_s, max(0, now - lease.accepted_at))
                   for p, lease in accepted.items()}
        unbooked = {p: seconds[p] - accepted[p].verified_s for p in seconds
                     if seconds[p] > accepted[p].verified_s}
        if unbooked:
            self.ledger.book(self.operator, chain_job, epoch, unbooked)
        self.ledger.settle(self.operator, chain_job)
        wei = {p: prices[p] * s for p, s in seconds.items()}
        log.info("chain job %d settled: %s", chain_job, wei)
        return Booking(seconds, wei, root)


def _bill_root(chain_job: int, seconds: dict[str, int], prices: dict[str, int]) -> str:
    """A commitment to the metered bill (the work records of issue 10 will replace it)."""
    lines = sorted((p, seconds[p], prices[p]) for p in seconds)
    digest = hashlib.sha256(json.dumps([chain_job, lines]).encode()).hexdigest()
    return "0x" + digest
