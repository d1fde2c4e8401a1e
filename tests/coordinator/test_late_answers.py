"""A worker's agent may answer a challenge after the verifier stopped waiting (a
loaded machine, a spot agent busy leaving). Tried as the parties that would use
that: an honest verifier must not lose stake for the `withheld` it filed while the
file was missing (the demo once slashed its own verifier so); a cheat must not
dodge its audit by answering late; and a verifier must not file `withheld` over a
file that is already in (a lazy verifier's way to "catch" every plant unreplayed).
Each on the embedded chain, with the job's real model replayed by the referee."""

from __future__ import annotations

import tomllib

import pytest

from shoal.verify.roles.verdicts import sign_verdict
from shoal.spec.audit import BlobKind, ChallengeRequest, SignedVerdictBody, VerdictFiling
from shoal.spec.coordinator import Grant, Role
from shoal.spec.proof import Verdict, VerdictKind
from shoal.spec.jobfile import parse_job
from tests.coordinator.refereed import remote_verifier
from tests.coordinator.test_disputes import CHEAT_STEP, Disputed
from tests.coordinator.test_proofs import PROOF_JOB, refused

# Each test here trains or hosts a job and runs a chain and a coordinator (over 5 s on
# two cores): out of `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

HONEST_STEP = 1


@pytest.fixture
def late(tmp_path):
    """The disputed job (its worker cheated at step 3), a granted verifier vera, and the
    referee's rulings held back until the test asks for them (`rule`)."""
    s = Disputed(tmp_path)
    s.vera = s.served.client(s.vera_key)
    s.served.client(s.operator).request(
        "POST", "/v1/grants", Grant(address=s.vera.account.address, role=Role.verifier, name="v"))
    held: list[int] = []
    s.co.referee.rule_later = lambda job_id, seqs: held.extend(seqs)
    s.held = held
    yield s
    s.close()


def _withheld(s, step: int) -> VerdictFiling:
    signed = sign_verdict(Verdict(job="tiny", epoch=0, step=step, worker=s.worker,
                                  kind=VerdictKind.withheld, detail="no answer in 20 s"),
                          s.vera.account)
    return VerdictFiling(verdicts=(SignedVerdictBody(verdict=signed.verdict,
                                                     signature=signed.signature),))


def _ask(s, step: int) -> None:
    s.vera.raise_challenges(s.job_id, [ChallengeRequest(worker=s.worker, step=step),
                                       ChallengeRequest(worker=s.worker, step=step,
                                                        kind=BlobKind.params)])


def _answered(s) -> bool:
    return all(c.answered_at_s for c in s.vera.challenges(s.job_id))


def _events(s, kind: str) -> list:
    return [e for e in s.vera.every_event(job=s.job_id) if e.kind == kind]


def test_an_honest_answer_after_the_verdict_costs_the_verifier_nothing(late):
    """Before: the referee saw the challenge answered and ruled the `withheld` a false
    accusation, and the verifier that had waited and filed lost stake."""
    s = late
    stake = s.ledger.stake_of(s.vera.account.address)
    _ask(s, HONEST_STEP)
    (filed,) = s.vera.file_verdicts(s.job_id, _withheld(s, HONEST_STEP))
    s.answer_until(lambda: _answered(s))  # the agent answers after the filing
    assert s.co.referee.rule(s.job_id, filed.seq) == "undecided"
    (ruled,) = [v for v in s.vera.verdicts(s.job_id) if v.seq == filed.seq]
    assert ruled.ruling == "undecided"
    (why,) = [e.detail["why"] for e in _events(s, "verdict_undecided")]
    assert "after the verdict was filed" in why and "nobody is at fault" in why
    assert s.ledger.stake_of(s.vera.account.address) == stake  # the verifier keeps its stake
    assert not s.ledger.lease(s.chain_job, s.p1.address).slashed  # and the worker its pay
    assert not _events(s, "verdict_rejected")


def test_a_cheat_that_answers_after_the_verdict_is_still_caught(late):
    s = late
    _ask(s, CHEAT_STEP)
    (filed,) = s.vera.file_verdicts(s.job_id, _withheld(s, CHEAT_STEP))
    s.answer_until(lambda: _answered(s))
    assert s.co.referee.rule(s.job_id, filed.seq) == "upheld"
    (slashed,) = _events(s, "worker_slashed")
    assert "wrong_contribution" in slashed.detail["why"]
    assert s.ledger.lease(s.chain_job, s.p1.address).slashed


def test_withheld_is_refused_over_a_file_already_answered(late):
    """A verifier that had the file (or could have) and files `withheld` anyway: refused
    before it is stored, so nothing is ruled and no plant counts it as caught."""
    s = late
    _ask(s, HONEST_STEP)
    s.answer_until(lambda: _answered(s))
    detail = refused(lambda: s.vera.file_verdicts(s.job_id, _withheld(s, HONEST_STEP)), 409)
    assert "were answered" in detail and "audit the record again" in detail
    assert s.vera.verdicts(s.job_id) == [] and s.held == []
    # Nobody asked for step 2's contribution: `withheld` there is taken, and rejected.
    (filed,) = s.vera.file_verdicts(s.job_id, _withheld(s, 2))
    assert s.co.referee.rule(s.job_id, filed.seq) == "rejected"


def test_a_verifier_audits_again_what_was_answered_after_its_wait(late, tmp_path):
    """The agent is silent through the verifier's whole wait and answers before it files:
    the verifier audits those records again on the late files, so it files what a replay
    shows (the cheat caught, the honest steps valid), not `withheld` or `unavailable`."""
    s = late
    spec = parse_job(tomllib.loads(PROOF_JOB), source="test")
    audits = remote_verifier(s.served, s.job_id, spec, s.vera_key, tmp_path / "vera",
                             answer_wait_s=0.5)
    assert audits.pending_epochs() == [0]
    waited = audits.replay

    def replay_then_answer(*args, **kwargs):
        result = waited(*args, **kwargs)
        assert {v.kind for v in result.verdicts} <= {VerdictKind.unavailable,
                                                     VerdictKind.withheld}
        s.answer_until(lambda: _answered(s))  # after the wait, before the filing
        return result

    audits.replay = replay_then_answer
    audits.audit(0)
    filed = {v.verdict.step: v.verdict.kind for v in s.vera.verdicts(s.job_id)}
    assert filed == {0: VerdictKind.valid, 1: VerdictKind.valid, 2: VerdictKind.valid,
                     CHEAT_STEP: VerdictKind.wrong_contribution, 4: VerdictKind.valid}
