"""Signing and sending contract transactions with explicit gas limits.

Keys stay local (eth-account signs, the node only sees raw transactions).
Gas limits are given by the caller, so no transaction waits on an estimate;
a revert, whether the node reports it on send or only as a failed receipt,
becomes the `ContractRevert` subclass its reason names.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import ContractLogicError, TimeExhausted, TransactionNotFound, Web3Exception

from shoal.ledger.chain import Chain, ChainKind
from shoal.ledger.errors import ChainUnavailable, ContractRevert, LedgerError, revert_error

log = logging.getLogger(__name__)

# Errors by which clients report a refused call: web3's own, eth-tester's
# (which web3 passes through), and JSON-RPC error replies.
try:
    from eth_tester.exceptions import TransactionFailed as _TesterFailed
except ImportError:  # eth-tester is only needed for the embedded chain
    _TesterFailed = ContractLogicError
_REFUSALS = (ContractLogicError, _TesterFailed, ValueError, Web3Exception)


class Sender:
    """Sends transactions for many local accounts over one chain connection."""

    def __init__(
        self,
        chain: Chain,
        receipt_timeout_s: float = 120.0,
        fee_refresh_s: float = 2.0,
    ) -> None:
        self.chain = chain
        self.receipt_timeout_s = receipt_timeout_s
        self.fee_refresh_s = fee_refresh_s
        self._nonces: dict[str, int] = {}
        self._lock = threading.Lock()  # nonces are per sender; callers may be threads
        self._max_fee = 0
        self._tip = 0
        self._fee_at = float("-inf")

    def _fees(self) -> tuple[int, int]:
        """(max fee, priority tip) per gas; refreshed at most every fee_refresh_s."""
        if time.monotonic() - self._fee_at > self.fee_refresh_s:
            eth = self.chain.w3.eth
            base = int(eth.get_block("latest")["baseFeePerGas"])
            if not self._tip:
                self._tip = int(eth.max_priority_fee)
            # Twice the base fee covers six full blocks of base-fee growth.
            self._max_fee = 2 * base + self._tip
            self._fee_at = time.monotonic()
        return self._max_fee, self._tip

    def _next_nonce(self, address: str) -> int:
        if address not in self._nonces:
            self._nonces[address] = int(
                self.chain.w3.eth.get_transaction_count(address, "pending")
            )
        nonce = self._nonces[address]
        self._nonces[address] = nonce + 1
        return nonce

    def forget_nonce(self, address: str) -> None:
        """Reload `address`'s nonce from the chain before its next transaction."""
        self._nonces.pop(address, None)

    def reset(self) -> None:
        """Forget every cached nonce and fee, e.g. after reverting a dev chain to a snapshot."""
        self._nonces.clear()
        self._fee_at = float("-inf")

    def send(
        self,
        account: LocalAccount,
        function: str,
        to: str | None,
        data: str,
        gas: int,
        value_wei: int = 0,
    ) -> Any:
        """Sign, send and wait for one transaction; returns its successful receipt."""
        w3 = self.chain.w3
        with self._lock:
            max_fee, tip = self._fees()
            tx: dict[str, Any] = {
                "type": 2,
                "chainId": self.chain.chain_id,
                "nonce": self._next_nonce(account.address),
                "gas": gas,
                "maxFeePerGas": max_fee,
                "maxPriorityFeePerGas": tip,
                "value": value_wei,
                "data": data,
            }
            if to is not None:
                tx["to"] = to
            raw = account.sign_transaction(tx).raw_transaction
            try:
                tx_hash = w3.eth.send_raw_transaction(raw)
            except _REFUSALS as error:
                # Some nodes mine a reverting transaction and still answer with
                # an error, others do not mine it: reload the nonce either way.
                self.forget_nonce(account.address)
                refusal = self._refusal(function, error)
                if isinstance(refusal, ContractRevert):
                    self._charge(refusal, bytes(Web3.keccak(raw)))
                raise refusal from error
            except OSError as error:
                self.forget_nonce(account.address)
                raise ChainUnavailable(f"{function}: lost the chain connection ({error})") from error
        receipt = self._wait(function, tx_hash)
        if receipt["status"] != 1:
            revert = self._replay_revert(function, tx, account.address, receipt)
            self._charge(revert, bytes(receipt["transactionHash"]), receipt)
            raise revert
        return receipt

    def _charge(self, revert: ContractRevert, tx_hash: bytes, receipt: Any = None) -> None:
        """Record on `revert` what the reverted transaction cost, if it was mined."""
        if receipt is None:
            try:
                receipt = self.chain.w3.eth.get_transaction_receipt(tx_hash)
            except TransactionNotFound:
                return
        revert.tx_hash = "0x" + tx_hash.hex()
        revert.fee_wei = int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])

    def _wait(self, function: str, tx_hash: bytes) -> Any:
        w3 = self.chain.w3
        if self.chain.kind is ChainKind.embedded:
            return w3.eth.get_transaction_receipt(tx_hash)  # mined on send
        try:
            return w3.eth.wait_for_transaction_receipt(
                tx_hash, timeout=self.receipt_timeout_s, poll_latency=0.05
            )
        except TimeExhausted as error:
            raise ChainUnavailable(
                f"{function}: transaction 0x{bytes(tx_hash).hex()} not mined within "
                f"{self.receipt_timeout_s:.0f} s; check the node and the gas price"
            ) from error

    def _refusal(self, function: str, error: Exception) -> LedgerError:
        message = getattr(error, "message", None) or str(error)
        if isinstance(error, ValueError) and error.args and isinstance(error.args[0], dict):
            message = str(error.args[0].get("message", message))
        if "revert" in message.lower():
            return revert_error(function, message)
        return LedgerError(f"{function}: the node refused the transaction: {message}")

    def _replay_revert(self, function: str, tx: dict[str, Any], sender: str, receipt: Any) -> ContractRevert:
        """Why a mined transaction failed: re-run it as a call on the state before it."""
        call = {k: tx[k] for k in ("to", "data", "value", "gas") if k in tx}
        call["from"] = sender
        try:
            self.chain.w3.eth.call(call, block_identifier=receipt["blockNumber"] - 1)
        except _REFUSALS as error:
            message = getattr(error, "message", None) or str(error)
            return revert_error(function, message)
        if receipt["gasUsed"] >= tx["gas"]:
            return ContractRevert(function, f"out of gas at the {tx['gas']} gas limit")
        return ContractRevert(function, "reverted without a reason")
