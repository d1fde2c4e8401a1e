"""Attacks on booking, escrow, stake and configuration, each against the honest story.

The attacker is named in each test (operator, submitter, provider, or a
client retry gone wrong); it must end no better off and the honest parties
no worse off than in the honest story.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shoal.ledger import (
    ChainUnavailable,
    InsufficientFunds,
    InvalidInput,
    InvalidState,
    Ledger,
    OutsideTimeWindow,
)
from shoal.ledger.transact import Sender
from shoal.spec.ledger import LedgerConfig
from tests.ledger.stage import GWEI, MIN_STAKE, SILENCE_S, STAKE, compare, staged


@pytest.fixture
def stage(embedded_chain):
    return staged(embedded_chain)


def _raw_book(s, epoch, provider, seconds):
    return s.ledger._transact(s.a.operator, "book", s.job, epoch, [provider], [seconds], items=1)


def test_operator_cannot_book_an_epoch_twice(stage):
    s, p = stage, stage.providers[0]
    with pytest.raises(InvalidState, match="already booked"):
        _raw_book(s, 0, p, 1)
    s.chain.advance_time(100)
    s.ledger.anchor(s.a.operator, s.job, 1, b"\x02" * 32)
    _raw_book(s, 1, p, 50)
    with pytest.raises(InvalidState, match="already booked"):
        _raw_book(s, 0, p, 1)  # nor go back to an earlier epoch
    with pytest.raises(InvalidState, match="already booked"):
        s.ledger._transact(s.a.operator, "book", s.job, 1, [s.providers[1]] * 2, [1, 1], items=2)
    assert s.ledger.lease(s.job, p).verified_s == 350


def test_client_retry_after_a_lost_receipt_books_once(stage, monkeypatch):
    s, p = stage, stage.providers[0]
    s.chain.advance_time(100)
    s.ledger.anchor(s.a.operator, s.job, 1, b"\x02" * 32)
    real_wait, lost = Sender._wait, []

    def lose_first_receipt(self, function, tx_hash):
        receipt = real_wait(self, function, tx_hash)  # the transaction is mined ...
        if not lost:
            lost.append(tx_hash)
            raise ChainUnavailable(f"{function}: not mined within 120 s")  # ... but the receipt is lost
        return receipt

    monkeypatch.setattr(Sender, "_wait", lose_first_receipt)
    s.ledger.book(s.a.operator, s.job, 1, {p: 100})
    assert lost and s.ledger.lease(s.job, p).verified_s == 400
    assert s.ledger.book(s.a.operator, s.job, 1, {p: 100}) == []  # and again: nothing


def test_operator_cannot_book_more_than_time_or_term_allow(embedded_chain):
    s = staged(embedded_chain, seconds=300)
    p = s.providers[0]
    s.ledger.anchor(s.a.operator, s.job, 1, b"\x02" * 32)
    with pytest.raises(InvalidInput, match="passed since"):
        _raw_book(s, 1, p, 10)  # 300 s booked in the 300 s since acceptance
    s.chain.advance_time(5000)
    with pytest.raises(InvalidInput, match="term"):
        _raw_book(s, 1, p, 701)  # the term is 1000 s
    _raw_book(s, 1, p, 700)


def test_operator_cannot_bill_a_provider_without_an_accepted_lease(stage):
    s, a = stage, stage.a
    held, owed = s.ledger.balance(), s.ledger.job(s.job).owed_wei
    with pytest.raises(InvalidState, match="no lease"):
        _raw_book(s, 0, a.stranger.address, 10)
    s.ledger.open_lease(a.operator, s.job, a.stranger.address, GWEI, 1000)
    s.chain.advance_time(100)
    s.ledger.anchor(a.operator, s.job, 1, b"\x02" * 32)
    with pytest.raises(InvalidState, match="not accepted"):
        _raw_book(s, 1, a.stranger.address, 10)
    assert (s.ledger.balance(), s.ledger.job(s.job).owed_wei) == (held, owed)


def test_front_run_claim_does_not_revert_the_batch(embedded_chain, stage):
    def honest(s):
        s.spent(s.ledger.settle(s.a.operator, s.job))

    def attack(s):
        honest(s)
        s.chain.advance_time(200)
        s.spent(s.ledger.claim(s.a.providers[0], s.job))  # lands first; finish() pays the batch

    before, after = compare(embedded_chain, stage, honest, attack)
    assert after == before
    assert all(not stage.ledger.lease(stage.job, p).unpaid for p in stage.providers)


def test_submitter_cannot_reclaim_what_providers_earned(embedded_chain, stage):
    sub = stage.a.submitters[0]

    def honest(s):
        s.spent(s.ledger.settle(s.a.operator, s.job))

    def attack(s):
        with pytest.raises(OutsideTimeWindow, match="silent") as refused:
            s.ledger.reclaim(sub, s.job)
        s.fees[sub.address] = s.fees.get(sub.address, 0) + refused.value.fee_wei
        s.chain.advance_time(SILENCE_S + 1)  # the operator goes quiet; the submitter pounces
        s.spent(s.ledger.reclaim(sub, s.job))

    before, after = compare(embedded_chain, stage, honest, attack)
    for p in stage.providers:
        assert after[p] == before[p]  # every provider paid for its booked work
    fee = 3 * 300 * GWEI * 200 // 10_000
    assert after[sub.address] == before[sub.address] + fee  # only the silent operator's fee


def test_one_stake_cannot_back_two_leases(embedded_chain):
    s = staged(embedded_chain)
    p = s.a.providers[0]
    s.ledger.unbond(p, STAKE - 2 * MIN_STAKE)  # left: one lease's collateral free
    job = s.ledger.create_job(s.a.submitters[1], GWEI, 10**16).returned
    s.ledger.open_leases(s.a.operator, job, {p.address: (GWEI, 100)})
    s.ledger.accept(p, job)
    third = s.ledger.create_job(s.a.submitters[1], 10**12, 10**16).returned
    s.ledger.open_leases(s.a.operator, third, {p.address: (10**12, 10_000)})  # can earn 10**16
    with pytest.raises(InsufficientFunds, match="collateral"):
        s.ledger.accept(p, third)
    s.ledger.stake(p, 10**16)
    s.ledger.accept(p, third)
    stake = s.ledger.stake_of(p.address)
    assert stake.locked_wei == 2 * MIN_STAKE + 10**16 == stake.active_wei
    with pytest.raises(InsufficientFunds, match="locked"):
        s.ledger.unbond(p, 1)


@pytest.mark.parametrize("field, value", [
    ("min_stake_wei", 0), ("min_bond_wei", 1), ("whistleblower_bps", 0),
    ("whistleblower_bps", 10_000), ("dispute_window_s", 0), ("dispute_timeout_s", 0),
])
def test_insecure_configuration_is_refused(embedded_chain, field, value):
    with pytest.raises(ValidationError, match=field):
        LedgerConfig(**{field: value})
    if field == "min_bond_wei":
        value = 0  # the contract's own floor
    unchecked = LedgerConfig.model_construct(**(LedgerConfig().model_dump() | {field: value}))
    a = embedded_chain.dev_accounts()
    with pytest.raises(InvalidInput):
        Ledger.deploy(embedded_chain, a[0], a[1].address, a[2].address, unchecked)


def test_default_configuration_deploys(embedded_chain):
    a = embedded_chain.dev_accounts()
    ledger = Ledger.deploy(embedded_chain, a[0], a[1].address, a[2].address)
    assert ledger.config() == LedgerConfig()
    assert LedgerConfig().min_stake_wei > 0 and LedgerConfig().min_bond_wei > 1
