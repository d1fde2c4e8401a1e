"""Attacks around forced errors: an operator cannot choose plants after the
verdicts, a lazy verifier is named and loses its bond, a diligent one is not,
and no worker is blamed for the operator's plant."""

from __future__ import annotations

import math
import os

import pytest

from shoal.proof import ForcedErrors, ProofError, score_verifiers, verify_reveal, without_plants
from shoal.spec.proof import VerdictKind
from tests.proof.factory import honest_epoch, verdict

SECRET = b"\x17" * 32


def test_the_planted_share_matches_the_rate():
    plan = ForcedErrors(os.urandom(32), 0.05)
    n = 20_000
    planted = sum(plan.is_planted("job", s // 25, s, f"w{s % 7}") for s in range(n))
    sigma = math.sqrt(0.05 * 0.95 / n)
    assert abs(planted / n - 0.05) < 5 * sigma


def test_plants_are_fixed_by_the_secret():
    a, b = ForcedErrors(SECRET, 0.2), ForcedErrors(SECRET, 0.2)
    items = [("job", 0, s, "w0") for s in range(200)]
    assert [a.is_planted(*i) for i in items] == [b.is_planted(*i) for i in items]
    other = ForcedErrors(b"\x18" * 32, 0.2)
    assert [a.is_planted(*i) for i in items] != [other.is_planted(*i) for i in items]


def test_an_operator_cannot_swap_the_secret_after_seeing_verdicts():
    plan = ForcedErrors(SECRET, 0.1)
    published = plan.commitment()
    assert verify_reveal(published, plan.reveal())
    # It would like another secret whose plants land where a verifier it favours said guilty.
    assert not verify_reveal(published, b"\x19" * 32)
    assert not verify_reveal(published, SECRET[:-1])


def test_a_guessable_secret_is_refused():
    with pytest.raises(ProofError, match="16 random bytes"):
        ForcedErrors(b"1234", 0.1)
    with pytest.raises(ProofError):
        ForcedErrors(SECRET, 1.5)


def test_a_lazy_verifier_is_named_and_a_diligent_one_is_not():
    plan = ForcedErrors(SECRET, 0.2)
    records = honest_epoch(range(25))
    planted = [r for r in records if plan.is_planted(r.job, 0, r.step, r.worker)]
    assert planted  # the epoch holds plants to catch
    lazy = [verdict(r, VerdictKind.valid, "lazy") for r in records]  # never replays
    diligent = [verdict(r, VerdictKind.wrong_contribution if r in planted else VerdictKind.valid,
                        "diligent") for r in records]
    blind = [verdict(r, VerdictKind.unavailable, "blind") for r in planted]
    score = score_verifiers(plan, [*lazy, *diligent, *blind])
    assert score.missed == {"lazy"}
    assert score.caught == {"diligent"}
    assert score.abstained == {"blind"}


def test_one_missed_plant_is_enough_to_lose_the_bond():
    plan = ForcedErrors(SECRET, 0.2)
    planted = [r for r in honest_epoch(range(25)) if plan.is_planted(r.job, 0, r.step, r.worker)]
    verdicts = [verdict(r, VerdictKind.wrong_contribution, "sloppy") for r in planted[1:]]
    verdicts.append(verdict(planted[0], VerdictKind.valid, "sloppy"))  # replays most, skips one
    assert score_verifiers(plan, verdicts).missed == {"sloppy"}
    assert score_verifiers(plan, verdicts).caught == set()


def test_no_worker_is_blamed_for_a_plant():
    plan = ForcedErrors(SECRET, 0.2)
    records = honest_epoch(range(25))
    verdicts = [verdict(r, VerdictKind.wrong_contribution
                        if plan.is_planted(r.job, 0, r.step, r.worker) else VerdictKind.valid)
                for r in records]
    assert any(v.guilty for v in verdicts)
    assert not any(v.guilty for v in without_plants(plan, verdicts))


def test_a_sealed_anchor_is_bound_to_the_records_and_opened_only_by_the_secret():
    from shoal.proof.forced import sealed_root

    secret = os.urandom(32)
    plan, other = ForcedErrors(secret, 0.1), ForcedErrors(os.urandom(32), 0.1)
    root = os.urandom(32)
    salt = plan.anchor_salt("job", 3)
    assert ForcedErrors(secret, 0.1).anchor_salt("job", 3) == salt  # anyone, once revealed
    assert len({salt, plan.anchor_salt("job", 4), plan.anchor_salt("job3", 3),
                other.anchor_salt("job", 3)}) == 4
    sealed = sealed_root(root, salt)
    assert sealed not in (root, sealed_root(root, plan.anchor_salt("job", 4)))
    assert sealed != sealed_root(os.urandom(32), salt)  # bound to the records' root
