"""The challenge window is the coordinator's, tried as the parties that would game it:
a verifier that waits until an honest worker's files are gone and then challenges them,
hoping to have the worker's silence slashed as withholding; and an agent, whose files
must outlive every challenge the coordinator took, and no more."""

from __future__ import annotations

import logging
import time
import tomllib

import pytest
from eth_account import Account

from shoal.agent.proofs import ProofRelay, proof_dir
from shoal.models.gpt_replay import gpt_replayer
from shoal.proof.layout import TENSORS, ProofLayout, step_of
from shoal.spec import hyper_digest, parse_job
from shoal.spec.audit import BlobKind, ChallengeRequest
from shoal.spec.coordinator import Heartbeat, JobSubmission, Registration
from shoal.spec.proof import Verdict, VerdictKind
from shoal.train.hashing import param_sha256
from tests.coordinator.conftest import Served, ruled_on
from tests.coordinator.refereed import remote_verifier
from tests.coordinator.test_proofs import (
    PRICE, PROOF_JOB, filed_proof_job, refused,
)

KEEP_S = 1.0
WINDOWED_JOB = PROOF_JOB + f"keep_s = {KEEP_S}\n"  # the [proof] section is the file's last
SPEC = parse_job(tomllib.loads(WINDOWED_JOB), "job_file")
REPLAYER = gpt_replayer(SPEC)


@pytest.fixture
def windowed(served: Served, operator):
    """A proof job with a one-second window, leased to agent-a; its worker filed the
    records of steps 0-5, and epoch 0 (steps 0-4) is rooted, so served, now."""
    # Records as the worker would file them: under the job's hyperparameters, each step
    # claiming to start from the model's first parameters.
    claims = {"hyper_sha256": hyper_digest(SPEC.hyperparameters()),
              "params_sha256": param_sha256(REPLAYER.model)}
    a, verifier, job_id, worker, _ = filed_proof_job(served, operator, WINDOWED_JOB, claims)
    return served, a, verifier, job_id, worker


def _after_window(client, job_id: str) -> None:
    (epoch,) = client.proof_epochs(job_id)
    time.sleep(max(0.0, epoch.challenges_close_at_s - time.time()) + 0.2)


def test_a_verifier_that_waits_out_the_window_cannot_have_an_honest_worker_slashed(windowed):
    served, a, verifier, job_id, worker = windowed
    coordinator = served.app.state.coordinator
    coordinator.referee.withheld_grace_s = 0.1
    (epoch,) = verifier.proof_epochs(job_id)
    assert epoch.epoch == 0 and epoch.challenges_open
    assert epoch.challenges_close_at_s == pytest.approx(time.time() + KEEP_S, abs=1.0)
    (in_time,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=1)])
    a.answer_challenge(in_time.challenge, b"the contribution of step 1")

    _after_window(verifier, job_id)
    (epoch,) = verifier.proof_epochs(job_id)
    assert not epoch.challenges_open
    # The agent has dropped the epoch's files by now: no challenge of them is taken.
    for kind in (BlobKind.reveal, BlobKind.params):
        detail = refused(lambda: verifier.raise_challenges(job_id, [
            ChallengeRequest(worker=worker, step=3, kind=kind)]), 410)
        assert "proof epoch 0" in detail and "keep_s" in detail
    assert a.heartbeat("agent-a", Heartbeat()).challenges == ()
    # What was asked for in time stays to be had: the same challenge, and its file.
    (again,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=1)])
    assert again.challenge == in_time.challenge
    assert verifier.challenge_file(in_time.challenge) == b"the contribution of step 1"
    # An epoch not served yet is open: step 5's epoch is not rooted.
    (later,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=5)])
    assert later.answered_at_s is None

    # Accusing the honest worker of withholding what could no longer be asked fails,
    # and costs the accuser, while the agent keeps beating.
    time.sleep(0.2)
    a.heartbeat("agent-a", Heartbeat())
    assert ruled_on(coordinator, verifier, job_id, Verdict(
        job="tiny", epoch=0, step=3, worker=worker, kind=VerdictKind.withheld),
        verifier.account) == "rejected"
    kinds = [e.kind for e in verifier.events(job=job_id)]
    assert "worker_slashed" not in kinds and "verdict_rejected" in kinds


def test_the_agent_drops_an_epochs_files_only_once_its_window_closed(windowed, tmp_path):
    served, a, verifier, job_id, worker = windowed
    folder = proof_dir(tmp_path, job_id)
    layout = ProofLayout(folder)
    for step in range(10):
        for path in (layout.reveal(worker, step), layout.local(worker, step),
                     layout.params(step)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"step {step}".encode())

    def kept(kind: str) -> list[int]:
        return sorted(step_of(p) for p in folder.glob(f"{kind}/**/*{TENSORS}"))

    relay = ProofRelay(a, tmp_path, "agent-a")
    relay.prune_margin_s = 0.3
    # Inside the window nothing goes, however often the agent looks.
    assert relay.prune(a.heartbeat("agent-a", Heartbeat()).at_s, now=True) == {}
    assert kept("reveal") == kept("local") == kept("params") == list(range(10))

    # A challenge taken just before the window closed reaches the agent after it did:
    # it is answered first, from the files still there, and only then do they go.
    (late,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=4)])
    _after_window(verifier, job_id)
    time.sleep(relay.prune_margin_s)
    reply = a.heartbeat("agent-a", Heartbeat())
    # A beat whose challenges were not all answered does not let files go.
    assert [c.challenge for c in reply.challenges] == [late.challenge]
    assert relay.answer(reply.challenges)
    assert verifier.challenge_file(late.challenge) == b"step 4"
    assert relay.prune(reply.at_s, now=True) == {job_id: 5}
    assert kept("reveal") == kept("local") == kept("params") == [5, 6, 7, 8, 9]
    # Step 5's epoch is not served: its files stay, and nothing is asked twice.
    assert relay.prune(a.heartbeat("agent-a", Heartbeat()).at_s, now=True) == {}
    assert kept("reveal") == [5, 6, 7, 8, 9]


def test_the_agent_keeps_the_files_of_a_beat_it_has_not_answered(windowed, tmp_path):
    """Pruning follows the coordinator's time of a beat whose challenges were answered,
    never the agent's own clock: a beat from before the window closed lets nothing go."""
    served, a, verifier, job_id, worker = windowed
    folder = proof_dir(tmp_path, job_id)
    path = ProofLayout(folder).reveal(worker, 2)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"step 2")
    before = a.heartbeat("agent-a", Heartbeat()).at_s
    relay = ProofRelay(a, tmp_path, "agent-a")
    relay.prune_margin_s = 0.0
    _after_window(verifier, job_id)
    assert relay.prune(before, now=True) == {}
    assert path.exists()


def test_a_verifier_late_for_an_epoch_does_not_accuse_its_workers(windowed, tmp_path, caplog):
    """A verifier that reaches an epoch after its window skips it; one whose challenges
    are refused mid-audit calls the files it could not ask for unavailable, never
    withheld (which the referee would reject, and charge it for)."""
    served, a, verifier, job_id, worker = windowed
    audits = remote_verifier(served, job_id, SPEC, verifier.account, tmp_path / "vera",
                             answer_wait_s=0.5)
    for step in range(5):  # fetched earlier: only the worker's own files are missing
        audits.store.save_params(step, REPLAYER.model.state_dict())
    # (Not asserted that the epoch was pending before: the window is one second, and on
    # a loaded machine building the verifier's replayer alone can outlast it.)
    _after_window(verifier, job_id)
    with caplog.at_level(logging.WARNING, logger="shoal.verify.roles.remote"):
        assert audits.pending_epochs() == []
    assert "challenge window closed" in caplog.text
    records = verifier.work_records(job_id, 0)
    result = audits.replay(0, records, records, unrecorded=False)
    assert result.verdicts and {v.kind for v in result.verdicts} == {VerdictKind.unavailable}
    assert all("window closed" in v.detail for v in result.verdicts)



def test_a_window_too_short_for_anyone_to_ask_is_refused_at_submission(served: Served):
    submitter = served.client(Account.create())
    submitter.register(Registration(role="submitter", name="alice"))
    detail = refused(lambda: submitter.submit(JobSubmission(
        name="tiny", job_file=PROOF_JOB + "keep_s = 0.1\n", workers=1,
        max_price_wei_per_s=PRICE, budget_wei=10**12)), 422)
    assert "keep_s = 0.1" in detail and "raise it" in detail
