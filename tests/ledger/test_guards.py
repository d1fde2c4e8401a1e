"""The contract against a reentrant receiver, and the gas budget of settlement.

The one function that sends ETH is `withdraw` (the whole credit, full gas);
`payout` only credits, so it never calls a receiver. A receiver that
re-enters the market from `withdraw`, with each call that could pay it
again, must end with exactly what it was owed, once, and a receiver that
refuses ETH must block nobody else. Paying providers must stay within 30,000
gas each (settle plus the batched credit), as bench/chain.py reports. A whale
that fills the contract to its cap cannot overflow one field of its account
word into the next.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import vyper
from eth_account import Account
from eth_tester import EthereumTester, PyEVMBackend
from web3 import EthereumTesterProvider, Web3

from shoal.ledger import Chain, ContractRevert, InsufficientFunds
from shoal.ledger.chain import ChainKind
from tests.ledger.conftest import Actors, deploy
from tests.ledger.stage import CONFIG, GWEI, MIN_STAKE, SILENCE_S, STAKE, UNBOND_S, WINDOW_S, staged

MAX_HELD = 2**85 - 1  # wei; the contract's cap, which keeps each field of an account word exact

RECEIVER = Path(__file__).resolve().parent / "contracts" / "reentrant_receiver.vy"
REENTRIES = {"withdraw": 1, "claim": 2, "payout": 3, "reclaim": 4}


def _deploy_receiver(chain, ledger, owner):
    out = vyper.compile_code(RECEIVER.read_text(), output_formats=["abi", "bytecode"])
    factory = chain.w3.eth.contract(abi=out["abi"], bytecode=out["bytecode"])
    data = factory.constructor(ledger.address).data_in_transaction
    receipt = ledger.sender.send(owner, "deploy receiver", None, data, 1_500_000)
    return chain.w3.eth.contract(address=receipt["contractAddress"], abi=out["abi"])


def _call(ledger, sender, contract, function, *args, value_wei=0):
    data = contract.encode_abi(function, args=list(args))
    return ledger.sender.send(sender, function, contract.address, data, 800_000, value_wei)


@pytest.fixture
def hostile(embedded_chain):
    """A settled job whose provider 0 is the hostile contract, owed 300 s of work."""
    s = staged(embedded_chain)
    chain, a, led = s.chain, s.a, s.ledger
    receiver = _deploy_receiver(chain, led, a.owner)
    _call(led, a.stranger, receiver, "stake", value_wei=STAKE)
    led.open_lease(a.operator, s.job, receiver.address, GWEI, 1000)
    _call(led, a.stranger, receiver, "accept", s.job)
    chain.advance_time(300)
    led.anchor(a.operator, s.job, 1, b"\x02" * 32)
    led.book(a.operator, s.job, 1, {receiver.address: 300})
    led.settle(a.operator, s.job)
    chain.advance_time(WINDOW_S)
    return s, receiver


@pytest.mark.parametrize("reentry", REENTRIES)
def test_hostile_receiver_in_a_payout_is_credited_once_and_blocks_nobody(hostile, reentry):
    s, receiver = hostile
    chain, led = s.chain, s.ledger
    _call(led, s.a.stranger, receiver, "set_reentry", REENTRIES[reentry], s.job)
    [out] = led.payout(s.a.stranger, s.job, [receiver.address, *s.providers, receiver.address])
    paid = [e.args["provider"] for e in out.events if e.name == "Paid"]
    assert paid == [receiver.address, *s.providers]  # once each; nothing was sent, so nothing re-entered
    assert chain.balance(receiver.address) == 0 and led.credit_of(receiver.address) == 300 * GWEI
    assert led.stake_of(receiver.address).locked_wei == 0
    for p in s.a.providers:  # the honest providers withdraw, whatever the receiver does with its own
        before = chain.balance(p.address)
        done = led.withdraw(p)
        assert chain.balance(p.address) - before + done.fee_wei == 300 * GWEI
    with pytest.raises(ContractRevert):
        _call(led, s.a.stranger, receiver, "withdraw")  # it refuses (re-enters): only it waits
    assert led.credit_of(receiver.address) == 300 * GWEI


@pytest.mark.parametrize("reentry", REENTRIES)
def test_reentrant_withdraw_is_paid_once(hostile, reentry):
    s, receiver = hostile
    chain, led = s.chain, s.ledger
    _call(led, s.a.stranger, receiver, "claim", s.job)
    _call(led, s.a.stranger, receiver, "unbond", STAKE)  # its lease is paid: nothing is locked
    chain.advance_time(SILENCE_S)
    _call(led, s.a.stranger, receiver, "release_stake")
    owed = 300 * GWEI + STAKE
    assert led.credit_of(receiver.address) == owed
    _call(led, s.a.stranger, receiver, "set_reentry", REENTRIES[reentry], s.job)
    held = led.balance()
    with pytest.raises(ContractRevert):
        _call(led, s.a.stranger, receiver, "withdraw")  # re-enters when paid: all of it reverts
    assert led.credit_of(receiver.address) == owed and led.balance() == held
    assert chain.balance(receiver.address) == 0
    _call(led, s.a.stranger, receiver, "set_reentry", 0, s.job)
    _call(led, s.a.stranger, receiver, "withdraw")
    assert chain.balance(receiver.address) == owed and led.credit_of(receiver.address) == 0


def test_settlement_gas_per_provider(embedded_chain):
    s = staged(embedded_chain)
    a, led, chain = s.a, s.ledger, s.chain
    providers = [Account.create() for _ in range(20)]
    for p in providers:
        led.sender.send(a.owner, "transfer", p.address, "0x", 21_000, 10**17)
        led.stake(p, MIN_STAKE)
    job = led.create_job(a.submitters[0], GWEI, 10**17).returned
    led.open_leases(a.operator, job, {p.address: (GWEI, 3600) for p in providers})
    for p in providers:
        led.accept(p, job)
    chain.advance_time(3600)
    led.anchor(a.operator, job, 0, b"\x02" * 32)
    led.book(a.operator, job, 0, {p.address: 3600 for p in providers})
    settle = led.settle(a.operator, job)
    chain.advance_time(WINDOW_S)
    payouts = led.payout(a.operator, job, [p.address for p in providers])
    per_provider = (settle.gas_used + sum(o.gas_used for o in payouts)) / len(providers)
    assert per_provider <= 30_000, per_provider
    assert [led.credit_of(p.address) for p in providers] == [3600 * GWEI] * 20
    assert all(led.stake_of(p.address).locked_wei == 0 for p in providers)


def test_a_whale_cannot_overflow_an_account_word():
    """Stake, locked stake and credit share one word: filled to the contract's cap, each stays exact."""
    state = PyEVMBackend.generate_genesis_state(overrides={"balance": 2**87}, num_accounts=10)
    tester = EthereumTester(PyEVMBackend(genesis_state=state))
    chain = Chain(Web3(EthereumTesterProvider(tester)), ChainKind.embedded, tester=tester)
    a = Actors.of(chain)
    led = deploy(chain, a, **CONFIG)
    whale, other = a.providers[0], a.providers[1]
    led.stake(whale, MAX_HELD)
    for deposit in (lambda: led.stake(other, 1), lambda: led.stake(whale, 1),
                    lambda: led.create_job(a.submitters[0], GWEI, 1)):
        with pytest.raises(InsufficientFunds, match="at most 2\\*\\*85-1 wei"):
            deposit()
    assert led.stake_of(whale.address).active_wei == MAX_HELD and led.credit_of(whale.address) == 0
    led.unbond(whale, MAX_HELD)
    chain.advance_time(UNBOND_S)
    led.release_stake(whale)
    assert led.credit_of(whale.address) == MAX_HELD and led.stake_of(whale.address).active_wei == 0
    before = chain.balance(whale.address)
    done = led.withdraw(whale)
    assert chain.balance(whale.address) - before + done.fee_wei == MAX_HELD and led.balance() == 0
