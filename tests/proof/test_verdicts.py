"""Reading verdicts: one proven cheat makes a worker guilty, and a whistleblower's
re-check exposes both a lazy verifier and one that accuses an honest worker."""

from __future__ import annotations

from shoal.proof import disagreements, guilty_workers, summarise
from shoal.spec.proof import VerdictKind
from tests.proof.factory import honest_epoch, verdict

RECORDS = honest_epoch(range(5), workers=2)  # w0 and w1, five steps each


def test_one_guilty_verdict_among_many_honest_ones_is_enough():
    verdicts = [verdict(r, VerdictKind.valid) for r in RECORDS]
    verdicts[3] = verdict(RECORDS[3], VerdictKind.bad_commitment)  # w1 at step 1
    summary = summarise(verdicts)
    assert guilty_workers(verdicts) == {"w1"}
    assert summary["w1"].audited == 5 and len(summary["w1"].guilty_verdicts) == 1
    assert not summary["w0"].guilty


def test_an_unavailable_audit_blames_nobody():
    verdicts = [verdict(r, VerdictKind.unavailable) for r in RECORDS]
    summary = summarise(verdicts)
    assert guilty_workers(verdicts) == set()
    assert summary["w0"].audited == 0 and summary["w0"].unavailable == 5


def test_the_recheck_exposes_a_lazy_and_a_malicious_verifier():
    cheat = {(1, "w0"), (3, "w1")}  # the records that really cheat
    truth = [verdict(r, VerdictKind.wrong_contribution if (r.step, r.worker) in cheat
                     else VerdictKind.valid, "whistleblower") for r in RECORDS]
    lazy = [verdict(r, VerdictKind.valid, "lazy") for r in RECORDS]
    malicious = [verdict(r, VerdictKind.wrong_contribution if r.worker == "w0"
                         else VerdictKind.valid, "malicious") for r in RECORDS]
    missed = disagreements(lazy, truth)
    assert {(d.verdict.step, d.verdict.worker) for d in missed} == cheat
    assert all(d.missed for d in missed)
    accused = disagreements(malicious, truth)
    falsely = {(d.verdict.step, d.verdict.worker) for d in accused if not d.missed}
    assert falsely == {(0, "w0"), (2, "w0"), (3, "w0"), (4, "w0")}  # w0 cheated at step 1 only
    assert {(d.verdict.step, d.verdict.worker) for d in accused if d.missed} == {(3, "w1")}
    assert not disagreements(truth, truth)


def test_two_kinds_of_guilt_and_an_unavailable_recheck_are_not_contradictions():
    r = RECORDS[0]
    assert not disagreements([verdict(r, VerdictKind.bad_commitment)],
                             [verdict(r, VerdictKind.wrong_contribution)])
    assert not disagreements([verdict(r, VerdictKind.valid)], [verdict(r, VerdictKind.unavailable)])
