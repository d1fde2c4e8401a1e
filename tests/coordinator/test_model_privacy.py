"""A job's files are its submitter's model, and a name is never a path: tried as a
stranger who wants the parameters, and as a provider with one lease who wants to
write over another job's files (issue 40, points 4 and 5).

Before: `GET /v1/challenges/N/file` answered anyone, unsigned, with the file a
challenge brought in (a contribution, or the full parameters of a `params` one); a worker name was a path component taken as
given, and a served file was never re-checked against the hash taken when it came in.
"""

from __future__ import annotations

import pytest
from eth_account import Account
from pydantic import ValidationError

from shoal.client.http import CoordinatorRefused
from shoal.proof.layout import ProofLayout
from shoal.spec.audit import BlobKind, ChallengeRequest, RecordUpload
from shoal.spec.coordinator import Grant, Heartbeat, JobSubmission, OfferTerms, Registration, Role
from shoal.spec.worker import WorkerNameError
from tests.coordinator.conftest import Served, provider_with_agent
from tests.coordinator.test_proofs import PRICE, PROOF_JOB, publish, record, refused

TRAVERSAL = "agent-a-l1-a0-w0/../../../JOB2/reveal/VICTIM"
CONTRIBUTION = b"a worker's contribution: the model's gradient at a step"


def _job(served: Served, operator):
    """A proof job leased to agent-a (provider A); B is a provider with no lease on it;
    the worker's contribution to step 2 asked for by a verifier and answered by A."""
    a, b = served.client(Account.create()), served.client(Account.create())
    alice, vera = served.client(Account.create()), served.client(Account.create())
    for client, agent, price in ((a, "agent-a", PRICE), (b, "agent-b", 2 * PRICE)):
        provider_with_agent(client, agent)
        client.post_offer(OfferTerms(offer_id=f"dev-{agent[-1]}", agent_id=agent,
                                     price_wei_per_s=price))
    alice.register(Registration(role="submitter", name="alice"))
    job = alice.submit(JobSubmission(name="tiny", job_file=PROOF_JOB, workers=1,
                                     max_price_wei_per_s=2 * PRICE, budget_wei=10**12))
    served.app.state.rounds.once()
    (lease,) = alice.job(job.job_id).leases
    worker = f"agent-a-l{lease.lease}-a0-w0"
    publish(served.app.state.coordinator, job.job_id, [worker], "start")
    served.client(operator).request("POST", "/v1/grants", Grant(
        address=vera.account.address, role=Role.verifier, name="vera"))
    a.upload_records(job.job_id, RecordUpload(lease=lease.lease, records=tuple(
        record(worker, s) for s in range(5))))
    (asked,) = vera.raise_challenges(job.job_id, [ChallengeRequest(worker=worker, step=2)])
    a.heartbeat("agent-a", Heartbeat())
    a.answer_challenge(asked.challenge, CONTRIBUTION)
    return dict(a=a, b=b, alice=alice, vera=vera, job_id=job.job_id, lease=lease.lease,
                worker=worker, challenge=asked.challenge)


def test_a_jobs_files_go_only_to_its_verifiers_submitter_and_lease_holders(served, operator):
    s = _job(served, operator)
    number = s["challenge"]
    for reader in ("vera", "alice", "a"):
        assert s[reader].challenge_file(number) == CONTRIBUTION
    # A provider of no lease on the job, a stranger's key, and no key at all.
    assert "submitter's" in refused(lambda: s["b"].challenge_file(number), 403)
    refused(lambda: served.client(Account.create()).challenge_file(number), 403)
    with pytest.raises(CoordinatorRefused) as unsigned:
        served.client().request("GET", f"/v1/challenges/{number}/file", sign=False, raw=True)
    assert unsigned.value.status == 401


def test_a_file_changed_on_disk_after_its_answer_is_not_served(served, operator):
    s = _job(served, operator)
    coordinator = served.app.state.coordinator
    path = ProofLayout(coordinator.records.proof_dir(s["job_id"])).reveal(s["worker"], 2)
    assert path.read_bytes() == CONTRIBUTION
    path.write_bytes(b"written over after the answer")
    assert "not the one answered" in refused(lambda: s["vera"].challenge_file(s["challenge"]), 409)


def test_a_worker_name_that_is_a_path_is_refused_at_every_boundary(served, operator):
    s = _job(served, operator)
    # At the API: a verifier's challenge, a provider's records (sent as a client bent on
    # it would: the typed values refuse to build them, so they are copied unchecked).
    bent = ChallengeRequest(worker=s["worker"], step=2).model_copy(update={"worker": TRAVERSAL})
    refused(lambda: s["vera"].raise_challenges(s["job_id"], [bent]), 422)
    forged = record(s["worker"], 6).model_copy(update={"worker": TRAVERSAL})
    refused(lambda: s["a"].upload_records(s["job_id"], RecordUpload(lease=s["lease"],
                                                                    records=(forged,))), 422)
    # In the typed values every party builds.
    for name in (TRAVERSAL, "..", ".", ".hidden", "a b", "a\\b", "x" * 129):
        with pytest.raises(ValidationError):
            ChallengeRequest(worker=name, step=0)
        with pytest.raises(ValidationError):
            record(name, 0)
    # And where a name becomes a path, whoever checked it before.
    layout = ProofLayout(served.app.state.coordinator.records.proof_dir(s["job_id"]))
    for name in (TRAVERSAL, "..", "."):
        for path_of in (lambda n: layout.reveal(n, 1), lambda n: layout.local(n, 1),
                        layout.records, lambda n: layout.plant(n, 1), layout.verdicts,
                        lambda n: layout.kept_dir(BlobKind.reveal, n)):
            with pytest.raises(WorkerNameError):
                path_of(name)
    assert layout.reveal(s["worker"], 1).parent.name == s["worker"]
