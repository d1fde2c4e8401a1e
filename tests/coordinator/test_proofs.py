"""Proof of learning through the coordinator, on both stores, tried as the
parties that would game it: a provider rewriting a committed record, or
speaking for another provider's worker or lease; a record sent after its
epoch was rooted; a record claiming a membership epoch, rank or world the
job's host never published; a challenge answered by someone else, or twice;
a verdict signed by another key or for another job; an accusation of a
record that does not exist; a worker that withholds what it committed to."""

from __future__ import annotations

import json
import time

import pytest
from eth_account import Account

from shoal.agent.proofs import ProofRelay, proof_dir
from shoal.client.http import CoordinatorRefused
from shoal.elastic.job_host import write_reached
from shoal.verify.roles.verdicts import sign_verdict
from shoal.proof.dues import Dues
from shoal.proof.epochs import final_lineage
from shoal.proof.merkle import epoch_tree
from shoal.spec.audit import (
    BlobKind, ChallengeRequest, RecordUpload, SignedVerdictBody, VerdictFiling,
)
from shoal.spec.coordinator import Grant, Heartbeat, JobSubmission, OfferTerms, Registration, Role
from shoal.spec.proof import Verdict, VerdictKind, WorkRecord
from shoal.verify.work_records import step_rng_seed
from tests.coordinator.conftest import TINY_JOB, Served, provider_with_agent, ruled_on

PRICE = 1_000_000
PROOF_JOB = TINY_JOB + "[proof]\nenabled = true\nepoch_steps = 5\n"


def record(worker: str, step: int, contribution: str = "c", job: str = "tiny", *,
           epoch: int = 0, rank: int = 0, shares: tuple[int, ...] = (8,)) -> WorkRecord:
    """`worker`'s record of `step`, committed in membership epoch `epoch` as `rank` of
    len(shares) (its positions are its rank's slice of the step's 8 samples)."""
    start = 8 * step + sum(shares[:rank])
    return WorkRecord(job=job, step=step, worker=worker, params_sha256="0" * 64,
                      positions_start=start, positions_end=start + shares[rank], rank=rank,
                      shares=shares, seed=7, global_batch=8, hyper_sha256="1" * 64,
                      contribution_sha256=(contribution * 64)[:64].replace("c", "a"),
                      contribution_norm=1.0, rng_seed=step_rng_seed(7, step, start),
                      membership_epoch=epoch)


def publish(coordinator, job_id: str, members: list[str], reason: str,
            source: str | None = None) -> int:
    """The job's host publishes the next membership epoch: one line of its epochs.jsonl,
    as the membership authority writes it (`source`: the state source it names).
    Returns the epoch's number."""
    path = coordinator.hosts.run_dir(job_id) / "epochs.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    epoch = len(path.read_text().splitlines()) if path.exists() else 0
    line = {"t": time.time(), "epoch": epoch, "members": members, "reason": reason}
    if source is not None:
        line["state_source"] = source
    with path.open("a") as log:
        log.write(json.dumps(line) + "\n")
    return epoch


def filed_proof_job(served: Served, operator, job_file: str, claims: dict | None = None):
    """A proof job leased to agent-a's provider, whose worker filed the records of steps
    0-5 (with `claims` over record()'s), and a granted verifier; epoch 0 is rooted.
    Returns (provider client, verifier client, job_id, worker, lease number)."""
    a, submitter, verifier = (served.client(Account.create()) for _ in range(3))
    provider_with_agent(a, "agent-a")
    a.post_offer(OfferTerms(offer_id="dev-a", agent_id="agent-a", price_wei_per_s=PRICE))
    submitter.register(Registration(role="submitter", name="alice"))
    job = submitter.submit(JobSubmission(name="tiny", job_file=job_file, workers=1,
                                         max_price_wei_per_s=PRICE, budget_wei=10**12))
    served.app.state.rounds.once()
    (lease,) = submitter.job(job.job_id).leases
    worker = f"agent-a-l{lease.lease}-a0-w0"
    publish(served.app.state.coordinator, job.job_id, [worker], "start")
    served.client(operator).request("POST", "/v1/grants", Grant(
        address=verifier.account.address, role=Role.verifier, name="vera"))
    a.upload_records(job.job_id, RecordUpload(lease=lease.lease, records=tuple(
        record(worker, s).model_copy(update=claims or {}) for s in range(6))))
    served.app.state.rounds.once()
    return a, verifier, job.job_id, worker, lease.lease


def host_reached(coordinator, job_id: str, step: int) -> None:
    """The job's host saw every member commit `step` (its reached.json, as it writes it)."""
    run_dir = coordinator.hosts.run_dir(job_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_reached(run_dir, step)


def refused(call, status: int) -> str:
    with pytest.raises(CoordinatorRefused) as caught:
        call()
    assert caught.value.status == status, caught.value.detail
    return caught.value.detail


@pytest.fixture
def market(served: Served, operator):
    """A proof job leased to agent-a (provider A); provider B runs agent-b, unleased."""
    a, b = served.client(Account.create()), served.client(Account.create())
    submitter, verifier = served.client(Account.create()), served.client(Account.create())
    for client, agent, price in ((a, "agent-a", PRICE), (b, "agent-b", 2 * PRICE)):
        provider_with_agent(client, agent)
        client.post_offer(OfferTerms(offer_id=f"dev-{agent[-1]}", agent_id=agent,
                                     price_wei_per_s=price))
    submitter.register(Registration(role="submitter", name="alice"))
    job = submitter.submit(JobSubmission(name="tiny", job_file=PROOF_JOB, workers=1,
                                         max_price_wei_per_s=2 * PRICE, budget_wei=10**12))
    served.app.state.rounds.once()
    (lease,) = submitter.job(job.job_id).leases
    assert lease.offer_id == "dev-a"
    # The job's host forms the first epoch with agent-a's worker, as rank 0 of 1.
    publish(served.app.state.coordinator, job.job_id, [f"agent-a-l{lease.lease}-a0-w0"], "start")
    served.client(operator).request("POST", "/v1/grants", Grant(
        address=verifier.account.address, role=Role.verifier, name="vera"))
    return served, a, b, verifier, job.job_id, lease.lease


@pytest.fixture
def pair(served: Served):
    """A two-worker proof job, formed by its host as epoch 0: agent-a's worker (provider A)
    rank 0 and agent-b's (provider B) rank 1, each computing 4 of a step's 8 samples."""
    a, b, job_id, leases = leased_pair(served)
    return served, a, b, job_id, leases


def leased_pair(served: Served):
    """Providers A and B (agents agent-a, agent-b) leased to a two-worker proof job, which
    its host formed as epoch 0 (agent-a's worker rank 0): A's and B's clients, the job's
    id and its leases by agent letter."""
    a, b, submitter = (served.client(Account.create()) for _ in range(3))
    for client, agent in ((a, "agent-a"), (b, "agent-b")):
        provider_with_agent(client, agent)
        client.post_offer(OfferTerms(offer_id=f"dev-{agent[-1]}", agent_id=agent,
                                     price_wei_per_s=PRICE))
    submitter.register(Registration(role="submitter", name="alice"))
    job = submitter.submit(JobSubmission(name="tiny", job_file=PROOF_JOB, workers=2,
                                         max_price_wei_per_s=PRICE, budget_wei=10**12))
    served.app.state.rounds.once()
    leases = {lease.offer_id[-1]: lease.lease for lease in submitter.job(job.job_id).leases}
    assert sorted(leases) == ["a", "b"]
    publish(served.app.state.coordinator, job.job_id,
            [f"agent-a-l{leases['a']}-a0-w0", f"agent-b-l{leases['b']}-a0-w0"], "start")
    return a, b, job.job_id, leases


def test_one_lease_uploading_a_step_far_ahead_does_not_root_its_peers_epochs(pair):
    """A record may name any step of the job. Before, one lease's record of step 14
    made epoch 0 (steps 0-4) "left behind": rooted incomplete at once, and its peer's
    records of steps 3 and 4, arriving a beat later, refused (their pay docked)."""
    served, a, b, job_id, leases = pair
    coordinator = served.app.state.coordinator
    wa, wb = (f"agent-{n}-l{leases[n]}-a0-w0" for n in "ab")
    a.upload_records(job_id, RecordUpload(lease=leases["a"], records=tuple(
        record(wa, s, rank=0, shares=(4, 4)) for s in range(3))))
    b.upload_records(job_id, RecordUpload(lease=leases["b"], records=(
        record(wb, 14, rank=1, shares=(4, 4)),)))
    served.app.state.rounds.once()
    assert a.proof_epochs(job_id) == []
    assert a.upload_records(job_id, RecordUpload(lease=leases["a"], records=tuple(
        record(wa, s, rank=0, shares=(4, 4)) for s in (3, 4)))).stored == 2
    # Once its peer too is two epochs on, and the host saw the job get there, epoch 0 is
    # left behind and rooted as it is.
    a.upload_records(job_id, RecordUpload(lease=leases["a"], records=tuple(
        record(wa, s, rank=0, shares=(4, 4)) for s in range(5, 11))))
    served.app.state.rounds.once()
    assert a.proof_epochs(job_id) == []  # the records' word alone roots nothing
    host_reached(coordinator, job_id, 10)
    served.app.state.rounds.once()
    assert [(e.epoch, e.records, e.complete) for e in a.proof_epochs(job_id)] == [(0, 5, False)]
    # A lease that stopped storing records does not hold the job back either: once b has
    # been quiet for the window, a's newest step alone counts.
    time.sleep(2 * coordinator.settings.agent_timeout_s + 0.1)
    a.upload_records(job_id, RecordUpload(lease=leases["a"], records=(
        record(wa, 15, rank=0, shares=(4, 4)),)))
    host_reached(coordinator, job_id, 15)
    served.app.state.rounds.once()
    assert [e.epoch for e in a.proof_epochs(job_id)] == [0, 1]


@pytest.fixture
def trio(served: Served):
    """A three-worker proof job leased to agent-a, agent-b and agent-c (a provider each;
    b and c could as well be one provider's two devices). No epoch published yet."""
    clients = {n: served.client(Account.create()) for n in "abc"}
    for n, client in clients.items():
        provider_with_agent(client, f"agent-{n}")
        client.post_offer(OfferTerms(offer_id=f"dev-{n}", agent_id=f"agent-{n}",
                                     price_wei_per_s=PRICE))
    submitter = served.client(Account.create())
    submitter.register(Registration(role="submitter", name="alice"))
    job = submitter.submit(JobSubmission(name="tiny", job_file=PROOF_JOB, workers=3,
                                         max_price_wei_per_s=PRICE, budget_wei=10**12))
    for n, client in clients.items():  # none silent past the agent timeout at the round
        client.heartbeat(f"agent-{n}", Heartbeat())
    served.app.state.rounds.once()
    leases = {lease.offer_id[-1]: lease.lease for lease in submitter.job(job.job_id).leases}
    assert sorted(leases) == ["a", "b", "c"]
    workers = {n: f"agent-{n}-l{leases[n]}-a0-w0" for n in "abc"}
    return served, clients, job.job_id, leases, workers


def file_records(trio, seats: str, steps, epoch: int = 0, shares: tuple[int, ...] = (3, 3, 2),
                 filers: str | None = None) -> None:
    """Each of `filers` (all of `seats`, membership epoch `epoch`'s members in rank order,
    unless told) files its records of `steps`."""
    served, clients, job_id, leases, workers = trio
    for rank, n in enumerate(seats):
        if filers is None or n in filers:
            clients[n].upload_records(job_id, RecordUpload(lease=leases[n], records=tuple(
                record(workers[n], s, epoch=epoch, rank=rank, shares=shares) for s in steps)))


def test_colluding_leases_filing_a_step_far_ahead_root_no_epoch_before_its_steps_ran(trio):
    """At step 2 of a three-worker job, b and c each file a record of step 19 (the job's
    last). Before, that made 19 the second newest lease's step: epochs 0-1 were "left
    behind", rooted incomplete at once, and a's records of steps 3 and 4, the steps it
    ran next, refused, so that a owed records it could never file. How far the job got
    is its host's word now: only the steps it saw every member commit."""
    served, clients, job_id, leases, workers = trio
    coordinator = served.app.state.coordinator
    publish(coordinator, job_id, [workers[n] for n in "abc"], "start")
    file_records(trio, "abc", range(3))
    host_reached(coordinator, job_id, 2)
    file_records(trio, "abc", (19,), filers="bc")  # the claims of a step far ahead
    served.app.state.rounds.once()
    assert clients["a"].proof_epochs(job_id) == []
    assert clients["a"].upload_records(job_id, RecordUpload(lease=leases["a"], records=tuple(
        record(workers["a"], s, rank=0, shares=(3, 3, 2)) for s in (3, 4)))).stored == 2
    # The run goes on as it would have: each epoch is rooted complete once its steps ran
    # and every seat's records are in, and a owes no record it could not file.
    file_records(trio, "abc", (3, 4), filers="bc")
    file_records(trio, "abc", range(5, 10))
    host_reached(coordinator, job_id, 9)
    served.app.state.rounds.once()
    assert [(e.epoch, e.records, e.complete)
            for e in clients["a"].proof_epochs(job_id)] == [(0, 15, True), (1, 15, True)]
    assert coordinator.records.record_dues(job_id, finished=False)[leases["a"]] == Dues(owed=10, filed=10)


def test_leases_seated_alone_in_an_old_epoch_complete_no_epoch_before_its_steps_ran(trio):
    """b and c formed the job's first membership epoch alone; a joined in the second. At
    step 2, b and c file steps 3 and 4 as members of the first, where their two seats
    are every seat: proof epoch 0 looks complete. Before, it was rooted at once, and a's
    records of steps 3 and 4, the steps it then ran, refused."""
    served, clients, job_id, leases, workers = trio
    coordinator = served.app.state.coordinator
    publish(coordinator, job_id, [workers["b"], workers["c"]], "start")
    publish(coordinator, job_id, [workers[n] for n in "abc"], "join")
    file_records(trio, "abc", range(3), epoch=1)
    host_reached(coordinator, job_id, 2)
    file_records(trio, "bc", (3, 4), epoch=0, shares=(4, 4))  # steps ahead of the job
    served.app.state.rounds.once()
    assert clients["a"].proof_epochs(job_id) == []
    assert clients["a"].upload_records(job_id, RecordUpload(lease=leases["a"], records=tuple(
        record(workers["a"], s, epoch=1, rank=0, shares=(3, 3, 2)) for s in (3, 4)))).stored == 2
    host_reached(coordinator, job_id, 5)  # once the steps ran, the epoch is rooted
    served.app.state.rounds.once()
    assert [e.epoch for e in clients["a"].proof_epochs(job_id)] == [0]


def test_a_jobs_end_roots_every_epoch_with_records_however_far_its_leases_got(pair):
    """While the job runs, an epoch waits for its members' records (up to the second
    newest lease's step); at its end every epoch with records is rooted (before, those past a lagging lease's step were
    left out of the final roots, and of what verifiers and the bill see)."""
    from shoal.coordinator.db.schema import JobRow

    served, a, b, job_id, leases = pair
    coordinator = served.app.state.coordinator
    wa, wb = (f"agent-{n}-l{leases[n]}-a0-w0" for n in "ab")
    a.upload_records(job_id, RecordUpload(lease=leases["a"], records=tuple(
        record(wa, s, rank=0, shares=(4, 4)) for s in range(13))))
    b.upload_records(job_id, RecordUpload(lease=leases["b"], records=tuple(
        record(wb, s, rank=1, shares=(4, 4)) for s in range(3))))
    served.app.state.rounds.once()
    assert a.proof_epochs(job_id) == []  # epoch 0 waits for b's steps 3 and 4
    with coordinator.desk.change() as session:
        coordinator.records.close_proofs(session, session.get(JobRow, job_id))
    assert [(e.epoch, e.records) for e in a.proof_epochs(job_id)] == [(0, 8), (1, 5), (2, 3)]


def test_records_are_commitments_that_only_the_lease_holder_can_make(market):
    served, a, b, _, job_id, lease = market
    worker = f"agent-a-l{lease}-a0-w0"
    first = [record(worker, s) for s in range(5)]
    assert a.upload_records(job_id, RecordUpload(lease=lease, records=tuple(first))).stored == 5
    again = a.upload_records(job_id, RecordUpload(lease=lease, records=tuple(first)))
    assert (again.stored, again.known) == (0, 5)  # a retried upload changes nothing

    rewritten = record(worker, 2, contribution="b")
    assert "never change" in refused(
        lambda: a.upload_records(job_id, RecordUpload(lease=lease, records=(rewritten,))), 409)
    refused(lambda: b.upload_records(job_id, RecordUpload(lease=lease, records=(record(worker, 6),))),
            403)  # B cannot speak on A's lease
    refused(lambda: a.upload_records(job_id, RecordUpload(
        lease=lease, records=(record(f"agent-b-l{lease}-a0-w0", 6),))), 403)  # nor A for others
    # nor a name that starts as A's lease but ends as another's: it would be paid or slashed
    # as the lease its end names.
    refused(lambda: a.upload_records(job_id, RecordUpload(
        lease=lease, records=(record(f"agent-a-l{lease}-a0-w0-l{lease + 1}-a0-w0", 6),))), 403)
    refused(lambda: a.upload_records(job_id, RecordUpload(
        lease=lease, records=(record(worker, 6, job="other"),))), 409)
    refused(lambda: a.upload_records(job_id, RecordUpload(
        lease=lease, records=(record(worker, 20),))), 409)  # past the job's last step
    # A DiLoCo step's claims in an every-step job would send its audits down the wrong path.
    from shoal.spec.proof import LocalStep
    claim = LocalStep(round_start=6, state_sha256="0" * 64, applied=True,
                      end_params_sha256="1" * 64, end_state_sha256="2" * 64)
    assert "lacks" not in refused(lambda: a.upload_records(job_id, RecordUpload(
        lease=lease, records=(record(worker, 6).model_copy(update={"local": claim}),))), 409)

    served.app.state.rounds.once()  # epoch 0 is complete: rooted once
    (epoch,) = a.proof_epochs(job_id)
    tree, _ = epoch_tree(first)
    assert (epoch.epoch, epoch.root, epoch.records, epoch.complete) == (0, "0x" + tree.root.hex(),
                                                                       5, True)
    assert a.work_records(job_id, 0) == first  # as committed, not as later sent
    late = record(f"agent-a-l{lease}-a1-w0", 3)
    assert "already rooted" in refused(
        lambda: a.upload_records(job_id, RecordUpload(lease=lease, records=(late,))), 409)
    served.app.state.rounds.once()
    assert len(a.proof_epochs(job_id)) == 1  # nothing re-rooted


def test_a_challenge_reaches_the_agent_holding_the_file_and_is_answered_once(market):
    served, a, b, verifier, job_id, lease = market
    worker = f"agent-a-l{lease}-a0-w0"
    a.upload_records(job_id, RecordUpload(lease=lease, records=tuple(record(worker, s)
                                                                     for s in range(5))))
    refused(lambda: a.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=2)]), 403)
    refused(lambda: verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=9)]),
            404)  # no such record
    reveal, params = verifier.raise_challenges(job_id, [
        ChallengeRequest(worker=worker, step=2),
        ChallengeRequest(worker="anyone", step=2, kind=BlobKind.params)])
    assert params.worker == worker and params.agent_id == "agent-a"  # the step's rank 0 holds them
    asked = a.heartbeat("agent-a", Heartbeat()).challenges
    assert {c.challenge for c in asked} == {reveal.challenge, params.challenge}
    assert b.heartbeat("agent-b", Heartbeat()).challenges == ()

    refused(lambda: b.answer_challenge(reveal.challenge, b"forged"), 403)
    answered = a.answer_challenge(reveal.challenge, b"the worker's file")
    assert answered.answered_at_s is not None and answered.sha256
    assert "final" in refused(lambda: a.answer_challenge(reveal.challenge, b"a better one"), 409)
    assert verifier.challenge_file(reveal.challenge) == b"the worker's file"
    refused(lambda: verifier.challenge_file(params.challenge), 404)  # not answered yet
    assert [c.challenge for c in a.heartbeat("agent-a", Heartbeat()).challenges] == \
        [params.challenge]
    # Asking again for what was asked gives the same challenge, not a second one.
    (same,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=2)])
    assert same.challenge == reveal.challenge


def test_verdicts_are_signed_by_their_filer_and_false_or_withheld_ones_are_ruled(market):
    served, a, b, verifier, job_id, lease = market
    coordinator = served.app.state.coordinator
    coordinator.referee.withheld_grace_s = 0.3
    worker = f"agent-a-l{lease}-a0-w0"
    a.upload_records(job_id, RecordUpload(lease=lease, records=tuple(record(worker, s)
                                                                     for s in range(5))))
    served.app.state.rounds.once()

    def filing(kind, step, signer=verifier.account, job="tiny", worker=worker):
        verdict = Verdict(job=job, epoch=0, step=step, worker=worker, kind=kind)
        signed = sign_verdict(verdict, signer)
        return VerdictFiling(verdicts=(SignedVerdictBody(verdict=signed.verdict,
                                                         signature=signed.signature),))

    refused(lambda: verifier.file_verdicts(job_id, filing(VerdictKind.valid, 1, Account.create())),
            403)  # signed by someone else
    refused(lambda: verifier.file_verdicts(job_id, filing(VerdictKind.valid, 1, job="other")), 409)
    refused(lambda: a.file_verdicts(job_id, filing(VerdictKind.valid, 1, a.account)), 403)

    # An accusation of a record nobody made is rejected.
    (ghost,) = verifier.file_verdicts(job_id, filing(VerdictKind.wrong_contribution, 3,
                                                     worker="agent-a-l99-a0-w0"))
    # A worker that does not answer while its agent keeps beating has withheld.
    verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=4)])
    time.sleep(0.4)
    a.heartbeat("agent-a", Heartbeat())
    (withheld,) = verifier.file_verdicts(job_id, filing(VerdictKind.withheld, 4))
    coordinator.referee.wait()
    rulings = {v.seq: v.ruling for v in verifier.verdicts(job_id)}
    assert rulings[ghost.seq] == "rejected" and rulings[withheld.seq] == "upheld"
    kinds = [e.kind for e in verifier.events(job=job_id)]
    assert "verdict_rejected" in kinds and "worker_slashed" in kinds
    # The caught provider's offer is withdrawn: its lease ends, a replacement is leased.
    (mine,) = [o for p in a.providers() for o in p.offers if o.offer_id == "dev-a"]
    assert mine.withdrawn
    b.heartbeat("agent-b", Heartbeat())
    served.app.state.rounds.once()
    live = [lease for lease in verifier.job(job_id).leases if lease.ends_at_s is None]
    assert [lease.offer_id for lease in live] == ["dev-b"]


def test_progress_is_kept_once_per_step_and_only_from_the_lease_holder(market):
    from shoal.spec.progress import ProgressUpload, StepProgress

    served, a, b, _, job_id, lease = market
    worker = f"agent-a-l{lease}-a0-w0"
    steps = tuple(StepProgress(step=s, t=100.0 + s, loss=5.0 - s / 10, world=1, samples=8)
                  for s in range(4))
    assert a.upload_progress(job_id, ProgressUpload(lease=lease, worker=worker, steps=steps)) == 4
    changed = tuple(p.model_copy(update={"loss": 0.0}) for p in steps)
    assert a.upload_progress(job_id, ProgressUpload(lease=lease, worker=worker, steps=changed)) == 0
    refused(lambda: b.upload_progress(job_id, ProgressUpload(lease=lease, worker=worker,
                                                             steps=steps)), 403)
    refused(lambda: a.upload_progress(job_id, ProgressUpload(
        lease=lease, worker=f"agent-b-l{lease}-a0-w0", steps=steps)), 403)
    assert a.progress(job_id) == list(steps)  # the first report stands
    assert [p.step for p in a.progress(job_id, after=1)] == [2, 3]
    (formed,) = a.membership(job_id)  # the host's epochs, as the coordinator reads them
    assert (formed.epoch, formed.members, formed.reason) == (0, (worker,), "start")


def test_a_verifier_is_told_when_the_agent_holding_a_file_is_offline(market):
    served, a, _, verifier, job_id, lease = market
    worker = f"agent-a-l{lease}-a0-w0"
    a.upload_records(job_id, RecordUpload(lease=lease, records=(record(worker, 0),)))
    (asked,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=0)])
    a.heartbeat("agent-a", Heartbeat())
    assert not verifier.challenges(job_id)[0].holder_offline
    time.sleep(served.app.state.coordinator.settings.agent_timeout_s + 0.2)
    (view,) = verifier.challenges(job_id)
    assert view.challenge == asked.challenge and view.holder_offline  # no answer can come soon


def test_a_step_redone_after_a_restore_supersedes_the_abandoned_lineage(market):
    """A step committed, then redone in a later membership epoch the job's host published
    after the job's state was restored: the newer records stand; an older one cannot come
    back; an accusation of the abandoned lineage's record is rejected, not held against its
    honest worker."""
    served, a, _, verifier, job_id, lease = market
    coordinator = served.app.state.coordinator
    first, second, third = (f"agent-a-l{lease}-a{n}-w0" for n in range(3))
    assert publish(coordinator, job_id, [first, third], "join") == 1
    old = [record(w, s, epoch=1, rank=r, shares=(4, 4)) for s in range(5)
           for r, w in enumerate((first, third))]
    assert a.upload_records(job_id, RecordUpload(lease=lease, records=tuple(old))).stored == 10
    # third is lost with the live state; second joins, and the job goes on from the
    # checkpoint of step 3 (epochs published after the coordinator last read the file).
    publish(coordinator, job_id, [first], f"exit:{third}")
    assert publish(coordinator, job_id, [second, first], "join") == 3
    redone = [record(w, s, contribution="b", epoch=3, rank=r, shares=(4, 4)) for s in (3, 4)
              for r, w in enumerate((second, first))]
    assert a.upload_records(job_id, RecordUpload(lease=lease, records=tuple(redone))).stored == 4
    back = record(first, 4, epoch=1, shares=(4, 4))
    assert "never change" in refused(
        lambda: a.upload_records(job_id, RecordUpload(lease=lease, records=(back,))), 409)
    served.app.state.rounds.once()
    (epoch,) = a.proof_epochs(job_id)
    assert epoch.complete  # every step has its final lineage's ranks
    # The params of a redone step are asked of the newest lineage's rank 0.
    (params,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker="x", step=3,
                                                                    kind=BlobKind.params)])
    assert params.worker == second
    assert ruled_on(coordinator, verifier, job_id, Verdict(
        job="tiny", epoch=0, step=3, worker=third, kind=VerdictKind.wrong_params),
        verifier.account) == "rejected"
    assert not [e for e in verifier.events(job=job_id) if e.kind == "worker_slashed"]


@pytest.mark.parametrize("said", [VerdictKind.valid, VerdictKind.unavailable])
def test_a_verifier_that_signed_valid_on_work_shown_wrong_is_penalised(market, operator, said):
    """A whistleblower's guilty verdict on a record another verifier called valid is upheld:
    the worker's provider is slashed and the lazy verifier is named for its penalty. One
    that said `unavailable` (no parameters to replay from when it looked) concluded
    nothing and loses nothing: the demo's honest verifier was slashed so, twice."""
    served, a, b, lazy, job_id, lease = market
    coordinator = served.app.state.coordinator
    coordinator.referee.withheld_grace_s = 0.3
    whistle = served.client(Account.create())
    served.client(operator).request("POST", "/v1/grants", Grant(
        address=whistle.account.address, role=Role.verifier, name="whistle"))
    worker = f"agent-a-l{lease}-a0-w0"
    a.upload_records(job_id, RecordUpload(lease=lease, records=tuple(record(worker, s)
                                                                     for s in range(5))))
    served.app.state.rounds.once()

    def file(client, kind):
        signed = sign_verdict(Verdict(job="tiny", epoch=0, step=4, worker=worker, kind=kind),
                              client.account)
        return client.file_verdicts(job_id, VerdictFiling(verdicts=(SignedVerdictBody(
            verdict=signed.verdict, signature=signed.signature),)))

    file(lazy, said)
    whistle.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=4)])
    time.sleep(0.4)
    a.heartbeat("agent-a", Heartbeat())  # alive, and not answering
    file(whistle, VerdictKind.withheld)
    coordinator.referee.wait()
    events = whistle.events(job=job_id)
    assert [e.detail["provider"] for e in events if e.kind == "worker_slashed"] == [a.account.address]
    penalties = [e for e in events if e.kind == "verifier_slashed"]
    if said is VerdictKind.unavailable:
        assert penalties == []
        return
    (penalty,) = penalties
    assert penalty.detail["verifier"] == lazy.account.address
    assert penalty.detail["shown_by"] == whistle.account.address


def test_a_record_claims_only_the_seat_the_job_host_published(pair):
    """B's worker tries to be the only final lineage of steps it shares with A's worker
    (so that A's honest records are neither audited nor counted), or to rewrite its own
    committed record, by claiming a membership epoch, rank or world the job's host never
    published. Each claim is refused naming what is wrong, and nothing of it is stored."""
    served, a, b, job_id, leases = pair
    honest, cheat = f"agent-a-l{leases['a']}-a0-w0", f"agent-b-l{leases['b']}-a0-w0"
    mine = [record(honest, s, rank=0, shares=(4, 4)) for s in range(5)]
    theirs = [record(cheat, s, rank=1, shares=(4, 4)) for s in range(4)]
    for client, lease, records in ((a, leases["a"], mine), (b, leases["b"], theirs)):
        upload = RecordUpload(lease=lease, records=tuple(records))
        assert client.upload_records(job_id, upload).stored == len(records)

    def attempt(**claim) -> str:
        worker = claim.pop("worker", cheat)
        step = claim.pop("step", 4)
        forged = record(worker, step, contribution="b", **{"rank": 1, "shares": (4, 4), **claim})
        return refused(lambda: b.upload_records(job_id, RecordUpload(lease=leases["b"],
                                                                     records=(forged,))), 409)

    assert "membership_epoch 7" in attempt(epoch=7)  # the newest lineage, by its own say
    assert "claims rank 0" in attempt(rank=0)  # A's seat (rank 0 keeps the parameters)
    assert "not a member" in attempt(worker=f"agent-b-l{leases['b']}-a1-w0")  # an extra worker
    assert "3 ways (shares)" in attempt(shares=(3, 3, 2))  # a world the epoch never had
    assert "membership_epoch 1" in attempt(step=3, epoch=1)  # a redo of its committed step 3
    # A batch carrying one forged claim is refused whole: nothing of it is stored.
    batch = (record(cheat, 4, rank=1, shares=(4, 4)), record(cheat, 4, epoch=2, rank=1,
                                                              shares=(4, 4)))
    refused(lambda: b.upload_records(job_id, RecordUpload(lease=leases["b"], records=batch)), 409)

    stored = a.work_records(job_id, 0)
    assert sorted(stored, key=lambda r: (r.step, r.worker)) == \
        sorted(mine + theirs, key=lambda r: (r.step, r.worker))  # as committed, nothing forged
    assert sorted(final_lineage(stored), key=lambda r: (r.step, r.worker)) == \
        sorted(stored, key=lambda r: (r.step, r.worker))  # A's honest records all still count
    # B's honest step 4 still goes in, and the epoch is rooted complete, every record counted.
    assert b.upload_records(job_id, RecordUpload(lease=leases["b"], records=batch[:1])).stored == 1
    served.app.state.rounds.once()
    (epoch,) = a.proof_epochs(job_id)
    assert (epoch.records, epoch.complete) == (10, True)


def test_the_agent_sends_a_refused_batchs_good_records_one_by_one(market, tmp_path):
    """One record of a batch the coordinator refuses does not take the batch's good
    records with it, and the relay moves on rather than sending the refused one forever."""
    _, a, _, _, job_id, lease = market
    worker = f"agent-a-l{lease}-a0-w0"
    good = [record(worker, s) for s in (0, 1, 3)]
    forged = record(worker, 2, epoch=4)  # an epoch the job's host never published
    lines = [r.model_dump_json() for r in (good[0], good[1], forged, good[2])]
    folder = proof_dir(tmp_path, job_id) / "records"
    folder.mkdir(parents=True)
    (folder / f"{worker}.jsonl").write_text("".join(line + "\n" for line in lines))

    relay = ProofRelay(a, tmp_path, "agent-a")
    assert relay.upload({job_id}) == 4
    assert a.work_records(job_id, 0) == good
    assert relay.upload({job_id}) == 0  # nothing is sent again



def test_a_finished_job_waits_for_every_ranks_last_record_within_the_grace(pair):
    """Pay follows the records, so a finished job does not end on the first record of
    its last step: an agent a beat behind its peer would lose its last steps' pay."""
    served, a, b, job_id, leases = pair
    coordinator = served.app.state.coordinator
    honest, other = f"agent-a-l{leases['a']}-a0-w0", f"agent-b-l{leases['b']}-a0-w0"
    last = 19  # PROOF_JOB's 20 steps
    assert coordinator.records.awaiting_records(job_id)
    a.upload_records(job_id, RecordUpload(lease=leases["a"], records=(
        record(honest, last, rank=0, shares=(4, 4)),)))
    assert coordinator.records.awaiting_records(job_id)  # b's record of the last step is on its way
    b.upload_records(job_id, RecordUpload(lease=leases["b"], records=(
        record(other, last, rank=1, shares=(4, 4)),)))
    assert not coordinator.records.awaiting_records(job_id)
