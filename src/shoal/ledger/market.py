"""Typed client of the compute-market contract: every state change it offers.

Each method names the role that must send it (its first argument) and
returns a `TxOutcome` with the gas and fee it cost; reverts arrive as the
`ContractRevert` subclass of their reason (see `shoal.ledger.errors`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3

from shoal.ledger.acceptance import acceptance_row, sign_acceptance, signer_of
from shoal.ledger.artifact import load_artifact
from shoal.ledger.chain import Chain
from shoal.ledger.errors import ChainUnavailable, ContractRevert, LedgerError
from shoal.ledger.transact import Sender
from shoal.ledger.views import LedgerReader
from shoal.spec.ledger import LeaseAcceptance, LedgerConfig, TxOutcome

log = logging.getLogger(__name__)

MAX_BATCH = 256  # longest provider list in one `book` or `payout`; as in the contract

# Gas limits: the measured worst case (bench/chain.py prints the measured
# figures) plus headroom, so no transaction waits on eth_estimateGas. Batch
# calls add a per-item limit.
GAS_LIMITS: dict[str, int] = {
    "deploy": 5_500_000,
    "set_operator": 60_000,
    "set_referee": 60_000,
    "create_job": 250_000,
    "fund": 80_000,
    "open_leases": 60_000,
    "open_accepted_leases": 60_000,
    "accept": 90_000,
    "anchor": 120_000,
    "book": 80_000,
    "settle": 120_000,
    "reclaim": 120_000,
    "payout": 60_000,
    "claim": 100_000,
    "withdraw": 100_000,
    "stake": 80_000,
    "unbond": 120_000,
    "release_stake": 80_000,
    "slash": 400_000,
    "slash_verifier": 150_000,
    "open_dispute": 300_000,
    "resolve_dispute": 400_000,
    "expire_dispute": 150_000,
}
GAS_PER_ITEM: dict[str, int] = {"open_leases": 40_000, "open_accepted_leases": 50_000, "book": 35_000, "payout": 30_000}
BOOK_ATTEMPTS = 3  # a retry re-reads the chain first, so it never books twice


def _root_bytes(root: bytes | str) -> bytes:
    value = bytes.fromhex(root.removeprefix("0x")) if isinstance(root, str) else root
    if len(value) != 32:
        raise LedgerError(f"a Merkle root is 32 bytes, got {len(value)}")
    return value


class Ledger(LedgerReader):
    """A market contract to read and transact with, from local accounts."""

    def __init__(self, chain: Chain, address: str, sender: Sender | None = None) -> None:
        super().__init__(chain, address)
        self.sender = sender or Sender(chain)

    @classmethod
    def deploy(
        cls,
        chain: Chain,
        owner: LocalAccount,
        operator: str,
        referee: str,
        config: LedgerConfig | None = None,
        sender: Sender | None = None,
    ) -> Ledger:
        """Deploy a new market from the shipped bytecode; `owner` can rotate roles."""
        config = config or LedgerConfig()
        artifact = load_artifact()
        sender = sender or Sender(chain)
        factory = chain.w3.eth.contract(abi=list(artifact.abi), bytecode=artifact.bytecode)
        args = (
            Web3.to_checksum_address(operator),
            Web3.to_checksum_address(referee),
            config.fee_bps,
            config.whistleblower_bps,
            config.min_stake_wei,
            config.min_bond_wei,
            config.unbonding_delay_s,
            config.silence_timeout_s,
            config.dispute_window_s,
            config.dispute_timeout_s,
        )
        data = factory.constructor(*args).data_in_transaction
        receipt = sender.send(owner, "deploy", None, data, GAS_LIMITS["deploy"])
        ledger = cls(chain, receipt["contractAddress"], sender)
        ledger.deploy_outcome = ledger._outcome("deploy", receipt)
        return ledger

    @classmethod
    def at(cls, chain: Chain, address: str) -> Ledger:
        """The market already deployed at `address`."""
        if not chain.w3.eth.get_code(Web3.to_checksum_address(address)):
            raise LedgerError(f"no contract at {address} on chain {chain.chain_id}; check --contract")
        return cls(chain, address)

    # ------------------------------------------------------------ plumbing
    def _outcome(self, function: str, receipt: Any, returned: str | None = None) -> TxOutcome:
        events = self.decoder.decode_all(receipt["logs"])
        value = None
        if returned is not None:
            value = next(int(e.args[returned]) for e in events if returned in e.args)
        return TxOutcome(
            function=function,
            tx_hash="0x" + bytes(receipt["transactionHash"]).hex(),
            block=int(receipt["blockNumber"]),
            gas_used=int(receipt["gasUsed"]),
            fee_wei=int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"]),
            events=events,
            returned=value,
        )

    def _transact(
        self,
        account: LocalAccount,
        function: str,
        *args: Any,
        value_wei: int = 0,
        items: int = 0,
        returned: str | None = None,
    ) -> TxOutcome:
        data = self.contract.encode_abi(function, args=list(args))
        gas = GAS_LIMITS[function] + items * GAS_PER_ITEM.get(function, 0)
        receipt = self.sender.send(account, function, self.address, data, gas, value_wei)
        return self._outcome(function, receipt, returned)

    # ------------------------------------------------------------ owner
    def set_operator(self, owner: LocalAccount, account: str) -> TxOutcome:
        return self._transact(owner, "set_operator", Web3.to_checksum_address(account))

    def set_referee(self, owner: LocalAccount, account: str) -> TxOutcome:
        return self._transact(owner, "set_referee", Web3.to_checksum_address(account))

    # ------------------------------------------------------------ submitter
    def create_job(self, submitter: LocalAccount, max_price_wei_per_s: int, deposit_wei: int) -> TxOutcome:
        """Open a job with an escrow deposit; `returned` is the new job id."""
        return self._transact(
            submitter, "create_job", max_price_wei_per_s, value_wei=deposit_wei, returned="job"
        )

    def fund(self, submitter: LocalAccount, job: int, amount_wei: int) -> TxOutcome:
        return self._transact(submitter, "fund", job, value_wei=amount_wei)

    def reclaim(self, submitter: LocalAccount, job: int) -> TxOutcome:
        """Settle a job whose operator has been silent past the deadline (no fee)."""
        return self._transact(submitter, "reclaim", job)

    # ------------------------------------------------------------ operator
    def open_lease(
        self, operator: LocalAccount, job: int, provider: str, price_wei_per_s: int, term_s: int
    ) -> TxOutcome:
        """Offer `provider` a lease of at most `term_s` billable seconds; it must `accept` it."""
        return self.open_leases(operator, job, {provider: (price_wei_per_s, term_s)})[0]

    def open_leases(
        self, operator: LocalAccount, job: int, terms: Mapping[str, tuple[int, int]]
    ) -> list[TxOutcome]:
        """Offer leases in batches: provider -> (price per second, term in seconds)."""
        rows = [(Web3.to_checksum_address(p), int(price), int(t)) for p, (price, t) in terms.items()]
        outcomes = []
        for start in range(0, len(rows), MAX_BATCH):
            batch = rows[start : start + MAX_BATCH]
            columns = [list(c) for c in zip(*batch, strict=True)]
            outcomes.append(self._transact(operator, "open_leases", job, *columns, items=len(batch)))
        return outcomes

    def keep_active(self, operator: LocalAccount, job: int) -> TxOutcome:
        """Refresh the job's last operator activity without changing it (an empty
        `open_leases`), so its submitter cannot `reclaim` it as abandoned."""
        return self._transact(operator, "open_leases", job, [], [], [])

    def open_accepted_leases(
        self, operator: LocalAccount, job: int, acceptances: Sequence[LeaseAcceptance]
    ) -> list[TxOutcome]:
        """Open leases that their providers accepted by signature, in batches.

        Each signature is checked here first, so one bad one is named instead
        of reverting a batch. A provider whose free stake is below the
        collateral gets an offered lease (its LeaseOpened has `locked` 0).
        """
        rows = []
        for a in acceptances:
            if a.job != job or signer_of(a, self.chain.chain_id, self.address) != a.provider:
                raise LedgerError(f"the acceptance from {a.provider} is not its signature for job {job} here")
            rows.append(acceptance_row(a))
        return [
            self._transact(operator, "open_accepted_leases", job, rows[i : i + MAX_BATCH],
                           items=len(rows[i : i + MAX_BATCH]))
            for i in range(0, len(rows), MAX_BATCH)
        ]

    def sign_acceptance(
        self, provider: LocalAccount, job: int, price_wei_per_s: int, term_s: int, deadline: int
    ) -> LeaseAcceptance:
        """`provider` agrees to these terms on `job` of this market (no transaction)."""
        return sign_acceptance(provider, self.chain.chain_id, self.address, job, price_wei_per_s, term_s, deadline)

    def accept(self, provider: LocalAccount, job: int) -> TxOutcome:
        """Agree to the lease offered on `job`, locking its collateral from free stake."""
        return self._transact(provider, "accept", job)

    def anchor(self, operator: LocalAccount, job: int, epoch: int, root: bytes | str) -> TxOutcome:
        return self._transact(operator, "anchor", job, epoch, _root_bytes(root))

    def unbooked(self, job: int, epoch: int, verified_s: Mapping[str, int]) -> dict[str, int]:
        """The entries of `verified_s` whose work for `epoch` is not booked yet."""
        pending = {}
        for provider, seconds in verified_s.items():
            address = Web3.to_checksum_address(provider)
            if self.lease(job, address).booked_for(epoch):
                log.info("job %d epoch %d: %s is already booked; skipping it", job, epoch, address)
            else:
                pending[address] = int(seconds)
        return pending

    def book(self, operator: LocalAccount, job: int, epoch: int, verified_s: Mapping[str, int]) -> list[TxOutcome]:
        """Record verified seconds per provider for an anchored epoch, in batches.

        Idempotent: entries already booked for `epoch` are skipped, and after
        a lost receipt it re-reads the chain before sending what is missing.
        """
        outcomes: list[TxOutcome] = []
        for attempt in range(BOOK_ATTEMPTS):
            pairs = list(self.unbooked(job, epoch, verified_s).items())
            try:
                for start in range(0, len(pairs), MAX_BATCH):
                    batch = pairs[start : start + MAX_BATCH]
                    providers, seconds = [p for p, _ in batch], [s for _, s in batch]
                    outcomes.append(
                        self._transact(operator, "book", job, epoch, providers, seconds, items=len(batch))
                    )
                return outcomes
            except (ChainUnavailable, ContractRevert) as error:
                landed = isinstance(error, ChainUnavailable) or "already booked" in error.reason
                if not landed or attempt + 1 == BOOK_ATTEMPTS:
                    raise
                log.warning("book job %d epoch %d: %s; re-reading before a retry", job, epoch, error)
        return outcomes

    def settle(self, operator: LocalAccount, job: int) -> TxOutcome:
        return self._transact(operator, "settle", job)

    # ------------------------------------------------------------ paying out
    def payout(self, sender: LocalAccount, job: int, providers: Sequence[str]) -> list[TxOutcome]:
        """Credit each provider its earnings for a settled job, past its window (anyone may send this).

        Nothing is sent: each provider collects its credit with `withdraw`.
        """
        addresses = [Web3.to_checksum_address(p) for p in providers]
        return [
            self._transact(sender, "payout", job, addresses[i : i + MAX_BATCH], items=len(addresses[i : i + MAX_BATCH]))
            for i in range(0, len(addresses), MAX_BATCH)
        ]

    def claim(self, provider: LocalAccount, job: int) -> TxOutcome:
        """Move the provider's own earnings for a settled job into its credit."""
        return self._transact(provider, "claim", job)

    def withdraw(self, account: LocalAccount) -> TxOutcome:
        """Send the account all of its credit."""
        return self._transact(account, "withdraw")

    # ------------------------------------------------------------ provider stake
    def stake(self, provider: LocalAccount, amount_wei: int) -> TxOutcome:
        return self._transact(provider, "stake", value_wei=amount_wei)

    def unbond(self, provider: LocalAccount, amount_wei: int) -> TxOutcome:
        return self._transact(provider, "unbond", amount_wei)

    def release_stake(self, provider: LocalAccount) -> TxOutcome:
        return self._transact(provider, "release_stake")

    # ------------------------------------------------------------ referee and disputes
    def slash(self, referee: LocalAccount, job: int, provider: str, whistleblower: str) -> TxOutcome:
        """Take the lease's collateral, part to `whistleblower`, who first brought the evidence."""
        return self._transact(
            referee, "slash", job, Web3.to_checksum_address(provider), Web3.to_checksum_address(whistleblower)
        )

    def slash_verifier(self, referee: LocalAccount, verifier: str, amount_wei: int,
                       whistleblower: str) -> TxOutcome:
        """Take up to `amount_wei` of a verifier's unlocked (or unbonding) stake: it signed
        `valid` on a forced error. Part goes to `whistleblower`, the rest to the treasury."""
        return self._transact(referee, "slash_verifier", Web3.to_checksum_address(verifier),
                              amount_wei, Web3.to_checksum_address(whistleblower))

    def open_dispute(self, challenger: LocalAccount, job: int, provider: str, bond_wei: int) -> TxOutcome:
        """Accuse a provider of a job; `returned` is the new dispute id."""
        return self._transact(
            challenger,
            "open_dispute",
            job,
            Web3.to_checksum_address(provider),
            value_wei=bond_wei,
            returned="dispute",
        )

    def resolve_dispute(self, referee: LocalAccount, dispute: int, upheld: bool) -> TxOutcome:
        return self._transact(referee, "resolve_dispute", dispute, upheld)

    def expire_dispute(self, sender: LocalAccount, dispute: int) -> TxOutcome:
        return self._transact(sender, "expire_dispute", dispute)
