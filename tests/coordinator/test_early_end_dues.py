"""What a job that ends before its last step owes in work records, tried as the
submitter who would cut its providers' pay to be refunded more: the steps owed
are those the job's host saw every member commit, never a step that a
provider's progress report or record names."""

from __future__ import annotations

import time

import pytest

from shoal.proof.dues import Dues
from shoal.spec.audit import RecordUpload
from shoal.spec.progress import ProgressUpload, StepProgress
from tests.coordinator import test_settlement
from tests.coordinator.test_proofs import host_reached, record, refused
from tests.coordinator.test_settlement import PRICE, proof_job_accepted

# Each test here trains or hosts a job and runs a chain and a coordinator (over 5 s on
# two cores): out of `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

market = test_settlement.market  # the fixture: a coordinator settling on an embedded chain


def test_a_forged_progress_report_does_not_cut_honest_pay_at_a_cancel(market, tmp_path):
    """Alice's accomplice b holds a lease on her 20-step job. At step 9, with every record
    of steps 0-9 filed by both workers, b reports progress at step 19 and alice cancels.
    Before, the job then owed records of steps 0-19: a, having filed every record it could,
    was paid 10/20 of its time, and alice refunded the rest."""
    served, ledger, (alice, _, p1, p2) = market
    coordinator = served.app.state.coordinator
    chain_job, submitter, providers, job, leases, workers = proof_job_accepted(market, tmp_path)
    for rank, name in enumerate("ab"):
        providers[name].upload_records(job.job_id, RecordUpload(lease=leases[name], records=tuple(
            record(workers[name], step, rank=rank, shares=(4, 4)) for step in range(10))))
    host_reached(coordinator, job.job_id, 9)

    def report(step: int) -> int:
        return providers["b"].upload_progress(job.job_id, ProgressUpload(
            lease=leases["b"], worker=workers["b"],
            steps=(StepProgress(step=step, t=time.time(), loss=1.0, world=2, samples=8),)))

    refused(lambda: report(20), 409)  # past the job's last step
    assert report(19) == 1  # the curve takes it; the bill does not
    time.sleep(2)
    ledger.chain.advance_time(3)
    submitter.job_action(job.job_id, "cancel")
    (settled,) = [e for e in submitter.events(job=job.job_id) if e.kind == "job_settled"]
    assert settled.detail["records_withheld"] == {}
    # Every record the job owed a is filed, so a is paid all its metered time.
    assert coordinator.records.record_dues(job.job_id, finished=False)[leases["a"]] == Dues(10, 10)
    metered = {p: int(w) for p, w in settled.detail["metered_wei"].items()}
    # ... and the chain pays that, less at most the seconds its clock had not reached at
    # the anchor's block (a second or two, by load; the attack cut half of it).
    earned = ledger.lease(chain_job, p1.address).earned_wei
    assert metered[p1.address] - 2 * PRICE <= earned <= metered[p1.address]
