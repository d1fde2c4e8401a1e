"""How far a remote verifier looks for where a claimed DiLoCo round end was taken up.

Collusion: w0 claims its first round ended at Adam moments of its choosing (it goes
on from its true state), and w1, three epochs later, restarts from that claim (a
restart at theta_outer may take any earlier round end's state). The claim is measured
against the state w1 kept there. A verifier auditing epoch 0 that held the records of
epochs 0 and 1 only found nothing to measure against and said `unavailable`, no
verdict: the forger went free. It now holds every rooted epoch's records and asks w1's
agent for that kept start; the referee upholds the verdict and the provider is slashed."""

from __future__ import annotations

import pytest

from shoal.spec.proof import VerdictKind
from shoal.train.hashing import optimizer_state_sha256
from shoal.verify.proof_store import ProofStore
from tests.coordinator.refereed import answer_as_a, diloco_run_on_lease_a, remote_verifier
from tests.verify.roles.conftest import rewrite_record

# Each test here trains or hosts a job and runs a chain and a coordinator (over 5 s on
# two cores): out of `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

STEPS, EPOCH_STEPS = 16, 4  # rounds of 4 (ends at 3, 7, 11, 15), an epoch each
FORGED_END, TAKEN_UP = 3, 13  # w0's round end in epoch 0; w1's restart in epoch 3


def forge_and_take_up(work: ProofStore, ids: list[str]) -> None:
    forger, partner = ids
    _, state = work.load_local(forger, FORGED_END + 1)  # what its round's end truly left
    for slot in state.values():
        slot["exp_avg"] = slot["exp_avg"] * 50
    claimed = optimizer_state_sha256(state)
    end = next(r for r in work.records(forger) if r.step == FORGED_END)
    rewrite_record(work, end.model_copy(update={"local": end.local.model_copy(
        update={"end_state_sha256": claimed})}))
    params, _ = work.load_local(partner, TAKEN_UP)
    work.save_local(partner, TAKEN_UP, params, state)
    start = next(r for r in work.records(partner) if r.step == TAKEN_UP)
    rewrite_record(work, start.model_copy(update={"local": start.local.model_copy(
        update={"state_sha256": claimed})}))


@pytest.fixture
def job(tmp_path):
    with diloco_run_on_lease_a(tmp_path, STEPS, EPOCH_STEPS, 2, forge=forge_and_take_up) as s:
        yield s


def test_a_round_end_taken_up_epochs_later_is_measured_where_it_was(job):
    s = job
    forger, _ = s["workers"]
    audits = remote_verifier(s["served"], s["job_id"], s["spec"], s["vera"], s["tmp"] / "vera",
                             answer_wait_s=60.0)
    assert TAKEN_UP // EPOCH_STEPS in audits.pending_epochs()  # rooted, so served
    found = []
    answer_as_a(s["a"], s["work"], lambda: found.append(audits.audit(0)))
    (audit,) = found
    (verdict,) = [v for v in audit.verdicts if (v.worker, v.step) == (forger, FORGED_END)]
    assert verdict.kind is VerdictKind.wrong_contribution, verdict
    assert "does not end where" in verdict.detail
    # ... and it costs the forger: the referee's replay of the same files upholds it, and
    # lease a's provider is slashed (unpaid for the job).
    s["co"].referee.wait()
    client = s["served"].client(s["vera"])
    ruled = {(v.verdict.worker, v.verdict.step): v.ruling for v in client.verdicts(s["job_id"])
             if v.verdict.guilty}
    assert ruled[(forger, FORGED_END)] == "upheld", ruled
    assert s["ledger"].lease(s["chain_job"], s["p1"].address).slashed
