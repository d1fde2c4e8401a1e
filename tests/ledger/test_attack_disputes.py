"""Attacks on slashing and disputes, each played against the honest story.

Provider 2 (`cheat`) cheated; the whistleblower reports it. The stranger is
the cheat's sock puppet: the cheat and the sock are one attacker, so their
wealth is summed. Each test asserts the attacker ends no better off, and the
honest parties no worse off, than when the attacker did nothing.
"""

from __future__ import annotations

import pytest

from shoal.ledger import InsufficientFunds, InvalidInput, InvalidState, Ledger, OutsideTimeWindow, Unauthorized
from shoal.spec.ledger import DisputeState, LedgerConfig
from tests.ledger.stage import BOND, MIN_STAKE, UNBOND_S, WINDOW_S, compare, staged


@pytest.fixture
def stage(embedded_chain):
    return staged(embedded_chain)


def _attacker(wealth, s):
    return wealth[s.a.providers[2].address] + wealth[s.a.stranger.address]


def _honest(s):
    return [s.a.whistleblower.address, s.a.submitters[0].address, *s.providers[:2]]


def _assert_no_gain(s, before, after):
    assert _attacker(after, s) <= _attacker(before, s)
    for address in _honest(s):
        assert after[address] >= before[address], address


def _referee_slashes(s):
    s.spent(s.ledger.slash(s.a.referee, s.job, s.a.providers[2].address, s.a.whistleblower.address))


def test_cheat_front_runs_the_referee_with_its_own_dispute(embedded_chain, stage):
    def attack(s):
        sock = s.ledger.open_dispute(s.a.stranger, s.job, s.a.providers[2].address, BOND)
        s.spent(sock)
        _referee_slashes(s)  # goes through the open dispute
        assert s.ledger.dispute(sock.returned).state is DisputeState.superseded

    before, after = compare(embedded_chain, stage, _referee_slashes, attack)
    _assert_no_gain(stage, before, after)
    assert after[stage.a.whistleblower.address] == before[stage.a.whistleblower.address]


def test_cheat_disputes_itself_to_have_it_rejected(embedded_chain, stage):
    """A rejected self-accusation costs the bond, which goes to the treasury, not the accused."""
    def attack(s):
        sock = s.ledger.open_dispute(s.a.stranger, s.job, s.a.providers[2].address, BOND)
        s.spent(sock)
        s.spent(s.ledger.resolve_dispute(s.a.referee, sock.returned, upheld=False))
        assert s.ledger.credit_of(s.a.owner.address) == BOND
        assert s.ledger.credit_of(s.a.providers[2].address) == 0
        _referee_slashes(s)

    before, after = compare(embedded_chain, stage, _referee_slashes, attack)
    _assert_no_gain(stage, before, after)
    assert _attacker(after, stage) == _attacker(before, stage) - BOND


def test_later_sock_puppet_cannot_take_the_first_challengers_reward(embedded_chain, stage):
    cheat = stage.a.providers[2].address

    def honest(s):
        first = s.ledger.open_dispute(s.a.whistleblower, s.job, cheat, BOND)
        s.spent(first)
        s.spent(s.ledger.resolve_dispute(s.a.referee, first.returned, upheld=True))

    def attack(s):
        first = s.ledger.open_dispute(s.a.whistleblower, s.job, cheat, BOND)
        later = s.ledger.open_dispute(s.a.stranger, s.job, cheat, BOND)
        s.spent([first, later])
        with pytest.raises(InvalidState, match="earlier dispute first"):
            s.ledger.resolve_dispute(s.a.referee, later.returned, upheld=True)
        s.spent(s.ledger.resolve_dispute(s.a.referee, first.returned, upheld=True))
        assert s.ledger.dispute(later.returned).state is DisputeState.superseded

    before, after = compare(embedded_chain, stage, honest, attack)
    _assert_no_gain(stage, before, after)
    assert after[stage.a.whistleblower.address] - before[stage.a.whistleblower.address] == 0
    assert after[stage.a.whistleblower.address] > after[stage.a.stranger.address]


def test_pay_is_held_while_a_dispute_is_open(embedded_chain, stage):
    """A dispute opened at the end of the window holds pay until the verdict, which still slashes."""
    s, cheat = stage, stage.a.providers[2]
    s.ledger.settle(s.a.operator, s.job)
    embedded_chain.advance_time(WINDOW_S - 5)
    dispute = s.ledger.open_dispute(s.a.whistleblower, s.job, cheat.address, BOND).returned
    embedded_chain.advance_time(10)
    with pytest.raises(InvalidState, match="dispute on this lease is open"):
        s.ledger.claim(cheat, s.job)
    [out] = s.ledger.payout(s.a.stranger, s.job, s.providers)  # the others are paid
    assert [e.args["provider"] for e in out.events if e.name == "Paid"] == s.providers[:2]
    with pytest.raises(OutsideTimeWindow, match="window has closed"):
        s.ledger.slash(s.a.referee, s.job, cheat.address, s.a.stranger.address)
    before = s.ledger.credit_of(s.a.submitters[0].address)
    s.ledger.resolve_dispute(s.a.referee, dispute, upheld=True)
    forfeited = 300 * 10**9
    fee = forfeited * 200 // 10_000
    # The submitter gets back the cheat's pay, the operator's fee on it, and the collateral
    # less the whistleblower's reward (its share, half, capped at two bonds).
    assert s.ledger.credit_of(s.a.submitters[0].address) - before == forfeited + fee + MIN_STAKE - 2 * BOND
    assert s.ledger.payout(s.a.stranger, s.job, [cheat.address])[0].events == ()


def test_fake_referee_cannot_slash_or_decide(embedded_chain, stage):
    s, cheat = stage, stage.a.providers[2].address
    dispute = s.ledger.open_dispute(s.a.whistleblower, s.job, cheat, BOND).returned
    held = s.ledger.balance()
    for impostor in (s.a.stranger, s.a.operator, s.a.owner, s.a.providers[2]):
        with pytest.raises(Unauthorized, match="referee"):
            s.ledger.slash(impostor, s.job, s.providers[0], impostor.address)
        with pytest.raises(Unauthorized, match="referee"):
            s.ledger.resolve_dispute(impostor, dispute, upheld=False)
    assert s.ledger.balance() == held and s.ledger.dispute(dispute).state is DisputeState.open
    assert s.ledger.stake_of(s.providers[0]).locked_wei == MIN_STAKE


def test_accused_cannot_unbond_or_release_before_the_verdict(embedded_chain, stage):
    cheat = stage.a.providers[2]

    def honest(s):
        d = s.ledger.open_dispute(s.a.whistleblower, s.job, cheat.address, BOND)
        s.spent(d)
        s.spent(s.ledger.resolve_dispute(s.a.referee, d.returned, upheld=True))

    def attack(s):
        d = s.ledger.open_dispute(s.a.whistleblower, s.job, cheat.address, BOND)
        s.spent(d)
        free = s.ledger.stake_of(cheat.address).active_wei - MIN_STAKE
        with pytest.raises(InsufficientFunds, match="locked"):
            s.ledger.unbond(cheat, free + 1)
        s.spent(s.ledger.unbond(cheat, free))  # only the free part leaves
        embedded_chain.advance_time(UNBOND_S + 1)
        s.spent(s.ledger.release_stake(cheat))
        s.spent(s.ledger.withdraw(cheat))
        s.spent(s.ledger.resolve_dispute(s.a.referee, d.returned, upheld=True))

    before, after = compare(embedded_chain, stage, honest, attack)
    _assert_no_gain(stage, before, after)
    assert after[stage.a.whistleblower.address] == before[stage.a.whistleblower.address]
    assert stage.ledger.stake_of(cheat.address).active_wei == 0  # its collateral was taken in full


def test_expired_dispute_returns_the_bond_and_releases_pay(embedded_chain, stage):
    s, cheat = stage, stage.a.providers[2]
    dispute = s.ledger.open_dispute(s.a.stranger, s.job, cheat.address, BOND).returned
    with pytest.raises(OutsideTimeWindow, match="may still resolve"):
        s.ledger.expire_dispute(s.a.stranger, dispute)
    s.finish()  # expires it after the dispute timeout, then pays
    assert s.ledger.dispute(dispute).state is DisputeState.expired
    assert s.ledger.lease(s.job, cheat.address).unpaid is False
    assert s.ledger.stake_of(cheat.address).locked_wei == 0


def test_cheat_cannot_be_credited_before_the_window_to_escape_a_slash(embedded_chain, stage):
    """Earnings are credited only once the window has passed, when no slash can come: a
    cheat that rushes to be credited (itself or through its sock) gets nothing to withdraw."""
    cheat = stage.a.providers[2]

    def honest(s):
        s.spent(s.ledger.settle(s.a.operator, s.job))
        _referee_slashes(s)

    def attack(s):
        s.spent(s.ledger.settle(s.a.operator, s.job))
        embedded_chain.advance_time(WINDOW_S - 5)
        with pytest.raises(OutsideTimeWindow, match="after the job's dispute window"):
            s.ledger.claim(cheat, s.job)
        with pytest.raises(OutsideTimeWindow, match="after the job's dispute window"):
            s.ledger.payout(s.a.stranger, s.job, [cheat.address])
        with pytest.raises(InsufficientFunds, match="nothing to withdraw"):
            s.ledger.withdraw(cheat)
        _referee_slashes(s)  # still inside the window

    before, after = compare(embedded_chain, stage, honest, attack)
    _assert_no_gain(stage, before, after)
    assert stage.ledger.credit_of(cheat.address) == 0
    assert stage.ledger.lease(stage.job, cheat.address).slashed


def _whistleblower_catches_the_cheat(s):
    d = s.ledger.open_dispute(s.a.whistleblower, s.job, s.a.providers[2].address, BOND)
    s.spent(d)
    s.spent(s.ledger.resolve_dispute(s.a.referee, d.returned, upheld=True))


def test_cheats_sock_recovers_at_most_two_bonds_of_its_collateral(embedded_chain, stage):
    """The cheat's sock disputes first, with the real evidence (the cheat knows its own
    bad step), so the referee must uphold it and the first reward is the sock's. The
    reward is at most two minimum bonds: of the 10 bonds the lease locked, the cheat
    gets 2 back, not half of them (5, before the cap)."""
    cheat = stage.a.providers[2].address

    def attack(s):
        sock = s.ledger.open_dispute(s.a.stranger, s.job, cheat, BOND)
        honest = s.ledger.open_dispute(s.a.whistleblower, s.job, cheat, BOND)
        s.spent([sock, honest])
        s.spent(s.ledger.resolve_dispute(s.a.referee, sock.returned, upheld=True))
        assert s.ledger.dispute(honest.returned).state is DisputeState.superseded

    before, after = compare(embedded_chain, stage, _whistleblower_catches_the_cheat, attack)
    gained = _attacker(after, stage) - _attacker(before, stage)
    # Caught by the whistleblower, the cheat loses its collateral (10 bonds) and its pay;
    # caught through its sock, it still loses at least 8 bonds and its pay.
    assert gained == stage.ledger.max_reward() == 2 * BOND < MIN_STAKE // 2
    # The submitter, owed the collateral less the reward, is as whole as in the honest story;
    # the front-run whistleblower has its bond back and loses only the reward it would have had.
    assert after[stage.a.submitters[0].address] == before[stage.a.submitters[0].address]
    assert before[stage.a.whistleblower.address] - after[stage.a.whistleblower.address] == gained


def test_sock_disputes_cannot_take_the_referees_slot(embedded_chain, stage):
    """Sock disputes fill every slot anyone may use; the last is the referee's own, so its
    finding still holds the cheat's pay past the window until it rules."""
    cheat = stage.a.providers[2].address

    def referee_finds(s, socks=()):
        own = s.ledger.open_dispute(s.a.referee, s.job, cheat, BOND)
        s.spent(own)
        s.spent(s.ledger.settle(s.a.operator, s.job))
        embedded_chain.advance_time(WINDOW_S + 1)  # the window closes; the dispute holds the pay
        for sock in socks:  # decided oldest first: each unproven sock dispute loses its bond
            s.spent(s.ledger.resolve_dispute(s.a.referee, sock, upheld=False))
        s.spent(s.ledger.resolve_dispute(s.a.referee, own.returned, upheld=True))
        assert s.ledger.lease(s.job, cheat).slashed

    def attack(s):
        socks = [s.ledger.open_dispute(s.a.stranger, s.job, cheat, BOND) for _ in range(7)]
        s.spent(socks)
        with pytest.raises(InvalidState, match="too many open disputes") as eighth:
            s.ledger.open_dispute(s.a.stranger, s.job, cheat, BOND)
        sock = s.a.stranger.address
        s.fees[sock] = s.fees.get(sock, 0) + eighth.value.fee_wei  # its gas, mined or not
        referee_finds(s, [x.returned for x in socks])

    before, after = compare(embedded_chain, stage, referee_finds, attack)
    _assert_no_gain(stage, before, after)
    assert _attacker(before, stage) - _attacker(after, stage) == 7 * BOND


def test_a_bond_too_large_to_post_is_refused_at_deploy(embedded_chain):
    """The reward's cap (two bonds) is computed unchecked: no bond may exceed what the
    contract can hold."""
    a = embedded_chain.dev_accounts()
    with pytest.raises(InvalidInput, match="min_bond"):
        Ledger.deploy(embedded_chain, a[0], a[1].address, a[2].address, LedgerConfig(min_bond_wei=2**85))
