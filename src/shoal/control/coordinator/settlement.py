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

from eth_account.signers.local import LocalAccount

from shoal.control.coordinator.errors import Conflict
from shoal.ledger import Ledger, LedgerError
from shoal.ledger.acceptance import signer_of
from shoal.spec.coordinator import AcceptanceTerms
from shoal.spec.ledger import LeaseAcceptance

log = logging.getLogger(__name__)
ACCEPT_WITHIN_S = 600  # a signed acceptance is void this long after its terms were offered


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

    def check_escrow(self, chain_job: int, submitter: str, budget_wei: int,
                     max_price_wei_per_s: int) -> None:
        """The job on chain is the submitter's, open, and holds at least the budget."""
        try:
            escrow = self.ledger.job(chain_job)
        except LedgerError as error:
            raise Conflict(str(error)) from None
        if escrow.submitter.lower() != submitter.lower():
            raise Conflict(f"chain job {chain_job} belongs to {escrow.submitter}, not to you; "
                           "create your own with the contract's create_job")
        if escrow.settled_at:
            raise Conflict(f"chain job {chain_job} is settled; create a new one")
        if escrow.escrow_wei < budget_wei:
            raise Conflict(f"chain job {chain_job} holds {escrow.escrow_wei} wei in escrow, less "
                           f"than the budget of {budget_wei}: fund it first")
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

    def open_lease(self, acceptance: LeaseAcceptance, expected: AcceptanceTerms) -> None:
        """Open the provider's chain lease from its signature, if the terms are the ones offered."""
        offered = (expected.chain_job, expected.price_wei_per_s, expected.term_s)
        signed = (acceptance.job, acceptance.price_wei_per_s, acceptance.term_s)
        if signed != offered:
            raise Conflict(f"the acceptance is for (job, price, term) {signed}; the lease offered "
                           f"{offered}: sign the terms in the assignment")
        if signer_of(acceptance, self.ledger.chain.chain_id, self.contract) != acceptance.provider:
            raise Conflict("the acceptance is not signed by its provider for this contract")
        try:
            self.ledger.open_accepted_leases(self.operator, acceptance.job, [acceptance])
        except LedgerError as error:  # a revert: stake too low, deadline passed, ...
            raise Conflict(f"the chain refused the lease: {error}") from None

    def accepted_at(self, chain_job: int, provider: str) -> int:
        """Chain time the provider's lease was accepted (0: not yet)."""
        return self.ledger.lease(chain_job, provider).accepted_at

    def settle(self, chain_job: int, metered_s: dict[str, int]) -> Booking:
        """Anchor the metered bill, book each provider's seconds (capped by what the chain
        allows at the anchor's block) and settle: the unspent escrow goes back."""
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
        if any(seconds.values()):
            self.ledger.book(self.operator, chain_job, epoch,
                             {p: s for p, s in seconds.items() if s})
        self.ledger.settle(self.operator, chain_job)
        wei = {p: prices[p] * s for p, s in seconds.items()}
        log.info("chain job %d settled: %s", chain_job, wei)
        return Booking(seconds, wei, root)


def _bill_root(chain_job: int, seconds: dict[str, int], prices: dict[str, int]) -> str:
    """A commitment to the metered bill (the work records of issue 10 will replace it)."""
    lines = sorted((p, seconds[p], prices[p]) for p in seconds)
    digest = hashlib.sha256(json.dumps([chain_job, lines]).encode()).hexdigest()
    return "0x" + digest
