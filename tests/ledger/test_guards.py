"""The contract against a hostile account and the gas budget of settlement.

A receiver that re-enters the market when paid must not get paid twice, and
a push it refuses must become a credit. Paying providers must stay within
30,000 gas each (settle plus the batched push), as bench/chain.py reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import vyper
from eth_account import Account

from shoal.ledger import ContractRevert
from tests.ledger.conftest import Actors, deploy

RECEIVER = Path(__file__).resolve().parent / "contracts" / "reentrant_receiver.vy"
GWEI = 10**9


@pytest.fixture
def market(embedded_chain):
    actors = Actors.of(embedded_chain)
    ledger = deploy(embedded_chain, actors, silence_timeout_s=0, dispute_window_s=0, fee_bps=0)
    return embedded_chain, actors, ledger


def _deploy_receiver(chain, ledger, owner):
    out = vyper.compile_code(RECEIVER.read_text(), output_formats=["abi", "bytecode"])
    factory = chain.w3.eth.contract(abi=out["abi"], bytecode=out["bytecode"])
    data = factory.constructor(ledger.address).data_in_transaction
    receipt = ledger.sender.send(owner, "deploy receiver", None, data, 1_000_000)
    return chain.w3.eth.contract(address=receipt["contractAddress"], abi=out["abi"])


def _call(ledger, sender, contract, function, *args, value_wei=0):
    data = contract.encode_abi(function, args=list(args))
    return ledger.sender.send(sender, function, contract.address, data, 500_000, value_wei)


def test_reentrant_call_is_refused(market):
    chain, a, ledger = market
    receiver = _deploy_receiver(chain, ledger, a.owner)
    _call(ledger, a.stranger, receiver, "create_job", value_wei=10_000)
    job = ledger.job_count()
    chain.advance_time(1)
    _call(ledger, a.stranger, receiver, "reclaim", job)  # its whole escrow becomes its credit
    assert ledger.credit_of(receiver.address) == 10_000
    held = ledger.balance()
    with pytest.raises(ContractRevert):
        _call(ledger, a.stranger, receiver, "withdraw")  # calls create_job when paid
    assert ledger.credit_of(receiver.address) == 10_000
    assert ledger.balance() == held and chain.balance(receiver.address) == 0
    assert ledger.job_count() == job


def test_refused_push_becomes_a_credit(market):
    chain, a, ledger = market
    receiver = _deploy_receiver(chain, ledger, a.owner)
    job = ledger.create_job(a.submitters[0], GWEI, 10**15).returned
    ledger.open_lease(a.operator, job, receiver.address, GWEI)
    ledger.anchor(a.operator, job, 0, b"\x01" * 32)
    ledger.book(a.operator, job, 0, {receiver.address: 10})
    ledger.settle(a.operator, job)
    [out] = ledger.payout(a.stranger, job, [receiver.address])
    [paid] = [e for e in out.events if e.name == "Paid"]
    assert paid.args["pushed"] is False and paid.args["amount"] == 10 * GWEI
    assert ledger.credit_of(receiver.address) == 10 * GWEI
    assert chain.balance(receiver.address) == 0


def test_settlement_gas_per_provider(market):
    chain, a, ledger = market
    providers = [Account.create() for _ in range(20)]
    for p in providers:
        ledger.sender.send(a.owner, "transfer", p.address, "0x", 21_000, 10**16)
    job = ledger.create_job(a.submitters[0], GWEI, 10**17).returned
    for p in providers:
        ledger.open_lease(a.operator, job, p.address, GWEI)
    ledger.anchor(a.operator, job, 0, b"\x02" * 32)
    ledger.book(a.operator, job, 0, {p.address: 3600 for p in providers})
    before = [chain.balance(p.address) for p in providers]
    settle = ledger.settle(a.operator, job)
    payouts = ledger.payout(a.operator, job, [p.address for p in providers])
    per_provider = (settle.gas_used + sum(o.gas_used for o in payouts)) / len(providers)
    assert per_provider <= 30_000, per_provider
    assert [chain.balance(p.address) - b for p, b in zip(providers, before)] == [3600 * GWEI] * 20
