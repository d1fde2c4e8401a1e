"""Attacks on verifier bonds: a verifier stakes to audit, and one that signed
`valid` on a forced error (a wrong record the operator planted) loses bonded
stake, part to whoever showed it. `stranger` plays the verifier here."""

from __future__ import annotations

import pytest

from shoal.ledger import InvalidInput, InvalidState, Unauthorized
from tests.ledger.stage import BOND, MIN_STAKE, STAKE, UNBOND_S, staged

PENALTY = 10**15


@pytest.fixture
def stage(embedded_chain):
    s = staged(embedded_chain)
    s.spent(s.ledger.stake(s.a.stranger, STAKE))
    return s


def test_lazy_verifier_loses_its_bond_and_money_is_conserved(stage):
    s, verifier = stage, stage.a.stranger.address
    held = s.ledger.balance()
    before = {x: s.wealth(x) for x in (verifier, s.a.whistleblower.address, s.a.owner.address)}
    s.ledger.slash_verifier(s.a.referee, verifier, PENALTY, s.a.whistleblower.address)
    assert s.ledger.balance() == held  # nothing left the contract: stake became credits
    assert s.wealth(verifier) == before[verifier] - PENALTY
    reward = 2 * BOND  # the whistleblower's share (half) is capped at two minimum bonds
    assert s.wealth(s.a.whistleblower.address) == before[s.a.whistleblower.address] + reward
    assert s.wealth(s.a.owner.address) == before[s.a.owner.address] + PENALTY - reward


def test_unbonding_does_not_outrun_the_slash(embedded_chain, stage):
    s, verifier = stage, stage.a.stranger
    s.ledger.unbond(verifier, STAKE)  # sees the plant coming and runs
    s.ledger.slash_verifier(s.a.referee, verifier.address, PENALTY, s.a.whistleblower.address)
    embedded_chain.advance_time(UNBOND_S + 1)
    s.ledger.release_stake(verifier)
    assert s.ledger.credit_of(verifier.address) == STAKE - PENALTY


def test_only_the_referee_slashes_and_never_to_the_verifier_itself(stage):
    s, verifier = stage, stage.a.stranger.address
    for impostor in (s.a.operator, s.a.owner, s.a.whistleblower, s.a.providers[0], s.a.stranger):
        with pytest.raises(Unauthorized, match="referee"):
            s.ledger.slash_verifier(impostor, verifier, PENALTY, impostor.address)
    # Reporting itself would hand a lazy verifier back half of its own penalty.
    with pytest.raises(InvalidInput, match="whistleblower"):
        s.ledger.slash_verifier(s.a.referee, verifier, PENALTY, verifier)
    assert s.ledger.stake_of(verifier).active_wei == STAKE


def test_stake_locked_by_leases_is_left_to_the_leases(stage):
    """A provider that also verifies: its lease collateral still answers for its work."""
    s, provider = stage, stage.a.providers[2].address
    locked = s.ledger.stake_of(provider).locked_wei
    assert locked == MIN_STAKE
    s.ledger.slash_verifier(s.a.referee, provider, 10 * STAKE, s.a.whistleblower.address)
    after = s.ledger.stake_of(provider)
    assert after.active_wei == locked and after.locked_wei == locked
    s.ledger.slash(s.a.referee, s.job, provider, s.a.whistleblower.address)  # still all there
    assert s.ledger.stake_of(provider).active_wei == 0
    with pytest.raises(InvalidState, match="no unlocked stake"):
        s.ledger.slash_verifier(s.a.referee, provider, PENALTY, s.a.whistleblower.address)
