"""A DiLoCo worker that poisons its pseudo-gradients and files no record of any
step, through the coordinator: a verifier's remote audit challenges the states
the worker kept (from the agent of its lease), replays each record-less round
and names it; the referee's replay of the same files upholds the verdict and
slashes the provider on chain. A worker whose records were lost with its
machine replays to what it declared, and a verifier that accuses it loses stake.

The work is a real `shoal train` run of the job the coordinator hosts, its
workers named as the agent of lease a would name them; the test stands in for
that agent, uploading the honest worker's records and answering challenges
from the run's proof directory."""

from __future__ import annotations

import pytest

from shoal.spec.proof import Verdict, VerdictKind
from shoal.verify.audit.unrecorded import UNRECORDED
from tests.coordinator.conftest import ruled_on
from tests.coordinator.refereed import (
    answer_as_a, diloco_run_on_lease_a, remote_verifier,
)

# Each test here trains or hosts a job and runs a chain and a coordinator (over 5 s on
# two cores): out of `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

STEPS, EPOCH_STEPS = 16, 4  # rounds of 4: ends at 3, 7, 11, 15; epochs 0 and 1 are rooted
LOST = "tests.verify.roles.cheats:LostRecords"


@pytest.fixture
def job(tmp_path):
    with diloco_run_on_lease_a(tmp_path, STEPS, EPOCH_STEPS, 3, "--adversary=1=unrecorded", f"--adversary=2={LOST}") as s:
        assert {r.worker for r in s["work"].records()} == {s["workers"][0]}
        assert [e.epoch for e in s["a"].proof_epochs(s["job_id"])][:2] == [0, 1]
        yield s


def test_a_record_less_diloco_round_is_challenged_replayed_upheld_and_slashed(job):
    s = job
    honest, poisoner, lost = s["workers"]
    client = s["served"].client(s["vera"])
    found = _audit_epochs_0_and_1(s, answer_wait_s=60.0)
    assert len(found) == 2 and not any(audit.unnamed for audit in found)
    verdicts = [v for audit in found for v in audit.verdicts]
    assert sorted((v.step, v.kind) for v in verdicts if v.worker == poisoner) == \
        [(3, VerdictKind.wrong_contribution), (7, VerdictKind.wrong_contribution)], \
        [(v.worker, v.step, v.kind.value, v.detail) for v in verdicts if v.worker != honest]
    assert sorted((v.step, v.kind) for v in verdicts if v.worker == lost) == \
        [(3, VerdictKind.valid), (7, VerdictKind.valid)]
    assert all(v.detail.startswith(UNRECORDED) for v in verdicts if v.worker != honest)
    assert all(v.kind is VerdictKind.valid for v in verdicts if v.worker == honest)

    s["co"].referee.wait()
    ruled = sorted((v.verdict.worker, v.verdict.step, v.ruling)
                   for v in client.verdicts(s["job_id"]) if v.verdict.guilty)
    assert ruled == [(poisoner, 3, "upheld"), (poisoner, 7, "upheld")]
    assert s["ledger"].lease(s["chain_job"], s["p1"].address).slashed

    # The lost worker's round replays as it declared: accusing it costs the accuser.
    stake = s["ledger"].stake_of(s["vera"].address).active_wei
    assert ruled_on(s["co"], client, s["job_id"], Verdict(
        job="tiny", epoch=1, step=7, worker=lost, kind=VerdictKind.wrong_contribution),
        s["vera"]) == "rejected"
    assert s["ledger"].stake_of(s["vera"].address).active_wei < stake


def test_a_record_less_round_whose_kept_state_is_not_answered_is_upheld_as_withheld(job):
    """The lost worker's agent beats on but cannot show a state its round needs: the
    verifier's `withheld` stands with the referee (the same liveness rule as a recorded
    step's), and the provider is slashed."""
    s = job
    honest, poisoner, lost = s["workers"]
    s["co"].referee.withheld_grace_s = 0.5
    s["work"].layout.local(lost, 5).unlink()  # inside its round of steps 4-7
    client = s["served"].client(s["vera"])
    found = _audit_epochs_0_and_1(s, answer_wait_s=3.0)  # a beats throughout, answering what it has
    verdicts = {(v.worker, v.step): v.kind for audit in found for v in audit.verdicts}
    assert verdicts[(lost, 3)] is VerdictKind.valid
    assert verdicts[(lost, 7)] is VerdictKind.withheld
    s["co"].referee.wait()
    ruled = {(v.verdict.worker, v.verdict.step): v.ruling for v in client.verdicts(s["job_id"])
             if v.verdict.guilty}
    assert ruled[(lost, 7)] == "upheld", ruled
    assert s["ledger"].lease(s["chain_job"], s["p1"].address).slashed


def _audit_epochs_0_and_1(s, answer_wait_s: float) -> list:
    """Vera's remote audits of epochs 0 and 1, while lease a's agent beats and answers."""
    audits = remote_verifier(s["served"], s["job_id"], s["spec"], s["vera"], s["tmp"] / "vera",
                             answer_wait_s=answer_wait_s)
    assert audits.pending_epochs()[:2] == [0, 1]
    found = []
    answer_as_a(s["a"], s["work"], lambda: found.extend(audits.audit(e) for e in (0, 1)))
    return found
