"""The demo's chain: an embedded EVM with the market contract deployed, the
parties' prefunded accounts, and the books kept to show that no wei was
made or lost (every account's balance, the contract's, and the gas burned).

The coordinator's threads (API, market rounds, referee) all use this one
in-process chain; eth-tester is not made for threads, so every request to
it goes through one lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from eth_account import Account
from eth_account.signers.local import LocalAccount

from shoal.ledger import Chain, Ledger
from shoal.spec.ledger import LedgerConfig

STAKE_WEI = 10**17  # each provider's (and each verifier's) stake on the contract
# Short, so that the demo can move the chain past it and pay out; a real market keeps days.
DISPUTE_WINDOW_S = 60


@dataclass(frozen=True)
class Parties:
    owner: LocalAccount
    operator: LocalAccount
    referee: LocalAccount
    submitter: LocalAccount
    verifier: LocalAccount
    whistleblower: LocalAccount  # re-checks the verifier's verdicts
    providers: tuple[LocalAccount, ...]

    def all(self) -> list[LocalAccount]:
        return [self.owner, self.operator, self.referee, self.submitter, self.verifier,
                self.whistleblower, *self.providers]


class DemoChain:
    def __init__(self, providers: int) -> None:
        self.chain = Chain.embedded()
        _serialize(self.chain)
        accounts = self.chain.dev_accounts()
        if len(accounts) < 5 + providers:
            raise ValueError(f"the embedded chain has {len(accounts)} funded accounts; a demo "
                             f"with {providers} providers needs {5 + providers}")
        owner, operator, referee, submitter, verifier, *rest = accounts
        # The chain funds ten accounts: the whistleblower's is made and paid by the owner
        # (its verdicts, like the verifier's, are taken only while its stake covers them).
        whistleblower = Account.create()
        self._pay(owner, whistleblower.address, 2 * STAKE_WEI)
        self.parties = Parties(owner, operator, referee, submitter, verifier, whistleblower,
                               tuple(rest[:providers]))
        self.start_block = self.chain.w3.eth.block_number
        self.start_total = self.total()
        self.ledger = Ledger.deploy(self.chain, owner, operator.address, referee.address,
                                    LedgerConfig(min_stake_wei=10**15,
                                                 dispute_window_s=DISPUTE_WINDOW_S))
        for account in (*self.parties.providers, verifier, whistleblower):
            self.ledger.stake(account, STAKE_WEI)

    def _pay(self, sender: LocalAccount, to: str, value_wei: int) -> None:
        w3 = self.chain.w3
        fee = 2 * w3.eth.gas_price + 1
        signed = sender.sign_transaction({
            "to": to, "value": value_wei, "gas": 21_000, "chainId": w3.eth.chain_id,
            "nonce": w3.eth.get_transaction_count(sender.address),
            "maxFeePerGas": fee, "maxPriorityFeePerGas": 1})
        w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(signed.raw_transaction))

    def total(self) -> int:
        """Wei held by the parties and the contract."""
        addresses = [a.address for a in self.parties.all()]
        if hasattr(self, "ledger"):
            addresses.append(self.ledger.address)
        return sum(self.chain.balance(a) for a in addresses)

    def gas(self) -> tuple[dict[str, int], int]:
        """Gas used per contract function since the demo began, and the wei it cost."""
        w3 = self.chain.w3
        by_function: Counter[str] = Counter()
        fees = 0
        contract = self.ledger.contract
        for number in range(self.start_block + 1, w3.eth.block_number + 1):
            block = w3.eth.get_block(number, full_transactions=True)
            for tx in block["transactions"]:
                receipt = w3.eth.get_transaction_receipt(tx["hash"])
                fees += int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])
                to, data = tx.get("to"), tx.get("input") or tx.get("data")
                name = "deploy" if not to else "transfer"
                if to == contract.address and data:
                    try:
                        name = contract.decode_function_input(data)[0].fn_name
                    except ValueError:
                        name = "unknown"
                by_function[name] += int(receipt["gasUsed"])
        return dict(by_function), fees


def _serialize(chain: Chain) -> None:
    lock = threading.RLock()
    provider = chain.w3.provider
    request = provider.make_request

    def locked(method, params):  # noqa: ANN001, ANN202 - web3's provider signature
        with lock:
            return request(method, params)

    provider.make_request = locked
