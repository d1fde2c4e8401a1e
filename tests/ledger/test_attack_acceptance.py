"""Attacks on acceptance by signature: whoever holds a provider's signed
acceptance (the operator, or anyone who saw it) tries to open leases the
provider did not agree to. Each must be refused, leaving the provider's stake
unlocked and no lease it could be billed for.
"""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_typed_data

from shoal.ledger import InvalidInput, InvalidState, LedgerError, OutsideTimeWindow, Unauthorized
from shoal.ledger.acceptance import acceptance_row, sign_acceptance, typed_acceptance
from tests.ledger.conftest import Actors, deploy
from tests.ledger.stage import CONFIG, GWEI, MIN_STAKE, STAKE, WINDOW_S

SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
TERM_S = 1000


@pytest.fixture
def market(embedded_chain):
    """A fresh market, two staked providers, one open job; the chain's time now."""
    a = Actors.of(embedded_chain)
    led = deploy(embedded_chain, a, **CONFIG)
    for p in a.providers[:2]:
        led.stake(p, STAKE)
    job = led.create_job(a.submitters[0], GWEI, 10**16).returned
    return led, a, job


def _now(led) -> int:
    return int(led.chain.w3.eth.get_block("latest")["timestamp"])


def _raw_open(led, sender, job, acceptances):
    """Send acceptances as they are, past the client's own signature check."""
    rows = [acceptance_row(x) for x in acceptances]
    return led._transact(sender, "open_accepted_leases", job, rows, items=len(rows))


def _untouched(led, job, provider) -> None:
    assert not led.lease(job, provider).unpaid
    assert led.stake_of(provider).locked_wei == 0


def test_signed_acceptance_opens_an_accepted_lease_without_a_provider_transaction(market):
    led, a, job = market
    p = a.providers[0]
    nonce_before = led.chain.w3.eth.get_transaction_count(p.address)
    [out] = led.open_accepted_leases(a.operator, job, [led.sign_acceptance(p, job, GWEI, TERM_S, _now(led) + 60)])
    lease = led.lease(job, p.address)
    assert lease.unpaid and lease.accepted_at == led.chain.w3.eth.get_block(out.block)["timestamp"]
    assert led.stake_of(p.address).locked_wei == MIN_STAKE  # price x term = 10**12 < min_stake
    assert [e.args["locked"] for e in out.events if e.name == "LeaseOpened"] == [MIN_STAKE]
    assert led.chain.w3.eth.get_transaction_count(p.address) == nonce_before


def test_contract_and_client_sign_the_same_digest(market):
    led, a, job = market
    message = typed_acceptance(led.chain.chain_id, led.address, job, a.providers[0].address, GWEI, TERM_S, 12345)
    expected = encode_typed_data(full_message=message)
    digest = led._read("acceptance_digest", job, a.providers[0].address, GWEI, TERM_S, 12345)
    assert bytes(digest) == _hash_eip191_message(expected)


def test_replayed_acceptance_opens_nothing_more(market):
    led, a, job = market
    p = a.providers[0]
    signed = led.sign_acceptance(p, job, GWEI, TERM_S, _now(led) + 10_000)
    led.open_accepted_leases(a.operator, job, [signed])
    with pytest.raises(InvalidState, match="already has a lease"):
        _raw_open(led, a.operator, job, [signed])  # the same job again
    other = led.create_job(a.submitters[0], GWEI, 10**16).returned
    with pytest.raises(Unauthorized, match="not signed by"):
        _raw_open(led, a.operator, other, [signed])  # another job
    led.settle(a.operator, job)
    led.chain.advance_time(WINDOW_S)
    led.payout(a.stranger, job, [p.address])  # the lease is paid and its word cleared
    with pytest.raises(InvalidState, match="already settled"):
        _raw_open(led, a.operator, job, [signed])
    assert led.stake_of(p.address).locked_wei == 0 and not led.lease(other, p.address).unpaid


def test_acceptance_for_other_terms_is_refused(market):
    led, a, job = market
    p = a.providers[0]
    signed = led.sign_acceptance(p, job, GWEI, TERM_S, _now(led) + 60)
    for changed in ({"term_s": 10 * TERM_S}, {"price_wei_per_s": GWEI // 2}, {"deadline": _now(led) + 10**6}):
        with pytest.raises(Unauthorized, match="not signed by"):
            _raw_open(led, a.operator, job, [signed.model_copy(update=changed)])
    with pytest.raises(LedgerError, match="not its signature"):
        led.open_accepted_leases(a.operator, job, [signed.model_copy(update={"term_s": 10 * TERM_S})])
    _untouched(led, job, p.address)


def test_acceptance_signed_by_another_key_is_refused(market):
    led, a, job = market
    victim, attacker = a.providers[0], a.stranger
    forged = sign_acceptance(attacker, led.chain.chain_id, led.address, job, GWEI, TERM_S, _now(led) + 60)
    with pytest.raises(Unauthorized, match="not signed by"):
        _raw_open(led, a.operator, job, [forged.model_copy(update={"provider": victim.address})])
    _untouched(led, job, victim.address)


def test_acceptance_for_another_contract_or_chain_is_refused(market, embedded_chain):
    led, a, job = market
    p = a.providers[0]
    twin = deploy(embedded_chain, a, **CONFIG)  # same code, same chain, another address
    for chain_id, contract in ((led.chain.chain_id, twin.address), (led.chain.chain_id + 1, led.address)):
        signed = sign_acceptance(p, chain_id, contract, job, GWEI, TERM_S, _now(led) + 60)
        with pytest.raises(Unauthorized, match="not signed by"):
            _raw_open(led, a.operator, job, [signed])
    _untouched(led, job, p.address)


def test_malleated_signature_is_refused(market):
    led, a, job = market
    p = a.providers[0]
    signed = led.sign_acceptance(p, job, GWEI, TERM_S, _now(led) + 60)
    high_s = SECP256K1_N - int(signed.s, 16)  # the mirror signature: same signer, another (v, s)
    mirror = signed.model_copy(update={"s": f"0x{high_s:064x}", "v": 55 - signed.v})
    message = typed_acceptance(led.chain.chain_id, led.address, job, p.address, GWEI, TERM_S, signed.deadline)
    digest = encode_typed_data(full_message=message)
    with pytest.raises(InvalidInput, match="lower half"):
        _raw_open(led, a.operator, job, [mirror])
    for v in (0, 1, 29):  # a v other than 27/28 recovers nobody (the model itself refuses them)
        with pytest.raises(Unauthorized, match="not signed by"):
            _raw_open(led, a.operator, job, [signed.model_construct(**(signed.model_dump() | {"v": v}))])
    _untouched(led, job, p.address)
    assert Account.recover_message(digest, vrs=(signed.v, int(signed.r, 16), int(signed.s, 16))) == p.address


def test_expired_acceptance_is_refused(market):
    led, a, job = market
    p = a.providers[0]
    signed = led.sign_acceptance(p, job, GWEI, TERM_S, _now(led) + 60)
    led.chain.advance_time(120)
    with pytest.raises(OutsideTimeWindow, match="expired"):
        led.open_accepted_leases(a.operator, job, [signed])
    _untouched(led, job, p.address)


def test_provider_that_unbonds_after_signing_gets_an_offer_not_a_lock(market):
    # It cannot revert the operator's batch, nor be billed until it accepts.
    led, a, job = market
    p, q = a.providers[:2]
    deadline = _now(led) + 60
    batch = [led.sign_acceptance(x, job, GWEI, TERM_S, deadline) for x in (p, q)]
    led.unbond(p, STAKE)
    [out] = led.open_accepted_leases(a.operator, job, batch)
    assert [e.args["locked"] for e in out.events if e.name == "LeaseOpened"] == [0, MIN_STAKE]
    assert led.lease(job, p.address).unpaid and led.lease(job, p.address).accepted_at == 0
    led.chain.advance_time(100)
    led.anchor(a.operator, job, 0, b"\x01" * 32)
    with pytest.raises(InvalidState, match="not accepted"):
        led.book(a.operator, job, 0, {p.address: 100})
    led.book(a.operator, job, 0, {q.address: 100})
    assert led.stake_of(p.address).locked_wei == 0 and led.stake_of(q.address).locked_wei == MIN_STAKE
