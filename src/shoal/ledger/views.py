"""Read-only access to a deployed market: escrow, leases, stakes, anchors, events.

Reads are free eth_calls; they turn the contract's packed words and tuples
into the typed values of `shoal.spec.ledger`.
"""

from __future__ import annotations

from typing import Any

from web3 import Web3

from shoal.ledger.artifact import load_artifact
from shoal.ledger.chain import Chain
from shoal.ledger.errors import LedgerError
from shoal.ledger.events import EventDecoder
from shoal.spec.ledger import (
    Anchor,
    ChainEvent,
    Dispute,
    DisputeState,
    JobEscrow,
    JobState,
    Lease,
    LedgerConfig,
    Stake,
)

# Layout of a lease word and an account word; mirrors the constants in compute_market.vy.
PRICE_MASK = 2**96 - 1
SECONDS_MASK = 2**40 - 1
BOOKED_SHIFT, TERM_SHIFT, ACCEPTED_SHIFT, EPOCH_SHIFT = 96, 136, 176, 216
EPOCH_MASK = 2**32 - 1
LEASE_OPEN = 1 << 248
LEASE_DISPUTED = 1 << 249
LEASE_SLASHED = 1 << 250
STAKE_MASK = 2**85 - 1
LOCKED_SHIFT, CREDIT_SHIFT = 85, 170
ZERO_ADDRESS = "0x" + "00" * 20
REWARD_BONDS = 2  # a whistleblower's reward is at most this many minimum bonds


class LedgerReader:
    """Typed views of one market contract at `address` on `chain`."""

    def __init__(self, chain: Chain, address: str) -> None:
        artifact = load_artifact()
        self.chain = chain
        self.address = Web3.to_checksum_address(address)
        self.contract = chain.w3.eth.contract(address=self.address, abi=list(artifact.abi))
        self.decoder = EventDecoder(artifact.abi)

    def _read(self, name: str, *args: Any) -> Any:
        return getattr(self.contract.functions, name)(*args).call({"from": self.chain.call_from})

    def config(self) -> LedgerConfig:
        return LedgerConfig(
            fee_bps=self._read("fee_bps"),
            whistleblower_bps=self._read("whistleblower_bps"),
            min_stake_wei=self._read("min_stake"),
            min_bond_wei=self._read("min_bond"),
            unbonding_delay_s=self._read("unbonding_delay_s"),
            silence_timeout_s=self._read("silence_timeout_s"),
            dispute_window_s=self._read("dispute_window_s"),
            dispute_timeout_s=self._read("dispute_timeout_s"),
        )

    def max_reward(self) -> int:
        """Most wei a slash pays its whistleblower, whatever its share: the first to show
        the evidence may be the cheat's sock (the contract's REWARD_BONDS)."""
        return REWARD_BONDS * self.config().min_bond_wei

    def roles(self) -> dict[str, str]:
        return {role: self._read(role) for role in ("owner", "operator", "referee")}

    def job_count(self) -> int:
        return int(self._read("job_count"))

    def job(self, job: int) -> JobEscrow:
        submitter, max_price, escrow, owed, fee, _, last_active, epochs, settled_at = self._read("jobs", job)
        if submitter == ZERO_ADDRESS:
            raise LedgerError(f"job {job} does not exist on {self.address}; list jobs with `shoal chain events`")
        return JobEscrow(
            job=job,
            submitter=submitter,
            state=JobState.settled if settled_at else JobState.open,
            max_price_wei_per_s=max_price,
            escrow_wei=escrow,
            owed_wei=owed,
            fee_wei=fee,
            epochs=epochs,
            last_active=last_active,
            settled_at=settled_at,
        )

    def lease(self, job: int, provider: str) -> Lease:
        word = int(self._read("leases", job, Web3.to_checksum_address(provider)))
        return Lease(
            job=job,
            provider=Web3.to_checksum_address(provider),
            unpaid=bool(word & LEASE_OPEN),
            price_wei_per_s=word & PRICE_MASK,
            term_s=(word >> TERM_SHIFT) & SECONDS_MASK,
            verified_s=(word >> BOOKED_SHIFT) & SECONDS_MASK,
            accepted_at=(word >> ACCEPTED_SHIFT) & SECONDS_MASK,
            next_epoch=(word >> EPOCH_SHIFT) & EPOCH_MASK,
            disputed=bool(word & LEASE_DISPUTED),
            slashed=bool(word & LEASE_SLASHED),
        )

    def stake_of(self, provider: str) -> Stake:
        provider = Web3.to_checksum_address(provider)
        word = int(self._read("accounts", provider))
        return Stake(
            provider=provider,
            active_wei=word & STAKE_MASK,
            locked_wei=(word >> LOCKED_SHIFT) & STAKE_MASK,
            unbonding_wei=self._read("unbonding", provider),
            release_at=self._read("release_at", provider),
        )

    def credit_of(self, account: str) -> int:
        """Wei the account may withdraw: earnings, refunds, fees, rewards, bonds, released stake."""
        return int(self._read("accounts", Web3.to_checksum_address(account))) >> CREDIT_SHIFT

    def dispute_count(self) -> int:
        """How many disputes were ever opened (ids run from 1)."""
        return int(self._read("dispute_count"))

    def dispute(self, dispute: int) -> Dispute:
        job, provider, challenger, bond, opened_at, state = self._read("disputes", dispute)
        if state == 0:
            raise LedgerError(f"dispute {dispute} does not exist on {self.address}")
        return Dispute(
            dispute=dispute,
            job=job,
            provider=provider,
            challenger=challenger,
            bond_wei=bond,
            opened_at=opened_at,
            state=DisputeState(state),
        )

    def anchors(self, job: int) -> list[Anchor]:
        epochs = self.job(job).epochs
        return [
            Anchor(job=job, epoch=e, root="0x" + bytes(self._read("roots", job, e)).hex())
            for e in range(epochs)
        ]

    def balance(self) -> int:
        """Wei held by the contract: escrow, stakes, bonds and unwithdrawn credits."""
        return self.chain.balance(self.address)

    def events(
        self, job: int | None = None, from_block: int = 0, to_block: int | str = "latest"
    ) -> list[ChainEvent]:
        """The contract's events in a block range, optionally only those of `job`."""
        logs = self.chain.w3.eth.get_logs(
            {"address": self.address, "fromBlock": from_block, "toBlock": to_block}
        )
        decoded = self.decoder.decode_all(logs)
        return [e for e in decoded if job is None or e.args.get("job") == job]
