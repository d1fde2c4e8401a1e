"""A step's parameters are kept by two of its workers, so that neither decides alone
whether the step can be audited. Tried as the keeper that would: it answers a state
the step's records do not claim, or garbage, or its agent goes quiet, or it hopes a
verifier asking again lands the challenge back on it. Each time the challenge moves,
under the same number, to the step's other keeper, and the verifier downloads the
honest keeper's file; an honest first keeper's answer is taken as it is."""

from __future__ import annotations

import time
import tomllib

import pytest
import torch
from eth_account import Account

from shoal.coordinator import Coordinator
from shoal.models.gpt_replay import gpt_replayer
from shoal.spec.audit import BlobKind, ChallengeRequest, RecordUpload
from shoal.spec.coordinator import Grant, Heartbeat, Role
from shoal.spec.jobfile import parse_job
from shoal.train.hashing import param_sha256
from shoal.verify.proof_store import ProofStore
from tests.coordinator.conftest import Served, make_settings
from tests.coordinator.test_proofs import PROOF_JOB, leased_pair, record, refused

STEP = 2
SPEC = parse_job(tomllib.loads(PROOF_JOB), source="test")
MODEL = gpt_replayer(SPEC).model
TRUE_STATE = {k: v.detach().clone() for k, v in MODEL.state_dict().items()}
TRUE_SHA256 = param_sha256(MODEL)


def _params_file(tmp_path, name: str, state: dict[str, torch.Tensor]) -> bytes:
    """`state` as a keeper's proof store writes the parameters of STEP."""
    store = ProofStore(tmp_path / name)
    store.save_params(STEP, state)
    return store.layout.params(STEP).read_bytes()


def _another_state() -> dict[str, torch.Tensor]:
    """The job's model with one weight nudged: loads fine, hashes to nobody's claim."""
    state = {k: v.clone() for k, v in TRUE_STATE.items()}
    state["pos_emb.weight"] += 1.0  # not tied to another entry, which would load over it
    return state


LIES = {
    "another_state": lambda tmp: _params_file(tmp, "liar", _another_state()),
    "garbage": lambda tmp: b"not a parameters file at all",
    "another_model": lambda tmp: _params_file(tmp, "liar", {"w": torch.zeros(3)}),
}


@pytest.fixture
def kept(store_url, operator, tmp_path):
    """A two-worker proof job on a coordinator that can build the job's model: agent-a's
    worker rank 0, agent-b's rank 1, both keepers of every step's parameters (a world of
    two), whose records of steps 0-4 all claim the model's first parameters."""
    co = Coordinator(make_settings(store_url, operator), replayer=gpt_replayer)
    served = Served(co)
    a, b, job_id, leases = leased_pair(served)
    verifier = served.client(Account.create())
    workers = {n: f"agent-{n}-l{leases[n]}-a0-w0" for n in "ab"}
    served.client(operator).request("POST", "/v1/grants", Grant(
        address=verifier.account.address, role=Role.verifier, name="vera"))
    yield dict(co=co, served=served, a=a, b=b, verifier=verifier, job_id=job_id,
               workers=workers, leases=leases, tmp=tmp_path,
               right=_params_file(tmp_path, "honest", TRUE_STATE))
    served.stop()
    co.hosts.stop_all()
    co.engine.dispose()


def _file_records(k, claims: dict[str, str] | None = None) -> None:
    """Each lease files its worker's records of steps 0-4 (`claims`: a worker's claim of
    STEP's starting parameters, if not the true one)."""
    claims = claims or {}
    for rank, n in enumerate("ab"):
        worker = k["workers"][n]
        records = tuple(record(worker, s, rank=rank, shares=(4, 4)).model_copy(update={
            "params_sha256": claims.get(n, TRUE_SHA256) if s == STEP else TRUE_SHA256})
            for s in range(5))
        k[n].upload_records(k["job_id"], RecordUpload(lease=k["leases"][n], records=records))


def _asked_of_a(k) -> int:
    """The verifier asks for STEP's parameters while both agents beat, a's the latest
    (an online keeper first, the one seen last): the challenge lands on a's keeper."""
    k["b"].heartbeat("agent-b", Heartbeat())
    k["a"].heartbeat("agent-a", Heartbeat())
    (asked,) = k["verifier"].raise_challenges(k["job_id"], [
        ChallengeRequest(worker="anyone", step=STEP, kind=BlobKind.params)])
    assert (asked.worker, asked.agent_id) == (k["workers"]["a"], "agent-a")
    return asked.challenge


def _held(k, number: int):
    (view,) = [v for v in k["verifier"].challenges(k["job_id"]) if v.challenge == number]
    return view


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_keeper_answering_what_the_step_did_not_start_from_hands_it_to_the_other(kept, lie):
    k = kept
    _file_records(k)
    number = _asked_of_a(k)
    detail = refused(lambda: k["a"].answer_challenge(number, LIES[lie](k["tmp"])), 409)
    assert k["workers"]["b"] in detail  # the agent is told what was wrong, and who is asked
    (event,) = [e for e in k["verifier"].events(job=k["job_id"]) if e.kind == "params_refused"]
    assert (event.detail["challenge"], event.detail["keeper"]) == (number, k["workers"]["a"])
    # The same challenge, now b's: the verifier polling its number keeps waiting.
    view = _held(k, number)
    assert (view.worker, view.agent_id, view.answered_at_s) == (k["workers"]["b"], "agent-b",
                                                                 None)
    assert k["a"].heartbeat("agent-a", Heartbeat()).challenges == ()
    assert [c.challenge for c in k["b"].heartbeat("agent-b", Heartbeat()).challenges] == [number]
    refused(lambda: k["a"].answer_challenge(number, k["right"]), 403)  # the liar's turn is over
    assert k["b"].answer_challenge(number, k["right"]).answered_at_s is not None
    assert k["verifier"].challenge_file(number) == k["right"]  # the step can be audited


@pytest.mark.parametrize("quiet", ["offline", "silent"])
def test_a_keeper_whose_agent_goes_quiet_is_joined_by_the_other(kept, quiet):
    """Offline: a's agent stops beating. Silent: it beats on and does not answer. Either
    way, once the agent timeout passes, b (which beats) is asked too, the verifier is not
    told the holder is offline, and a is still asked: a keeper only slow to answer (an
    honest agent with a batch of challenges) must not lose the step to one that may be
    gone. The first right answer stands, and the challenge then leaves both agents."""
    k = kept
    _file_records(k)
    number = _asked_of_a(k)
    timeout_s = k["co"].settings.agent_timeout_s
    deadline = time.monotonic() + timeout_s + 0.3
    while time.monotonic() < deadline:
        k["b"].heartbeat("agent-b", Heartbeat())
        if quiet == "silent":
            k["a"].heartbeat("agent-a", Heartbeat())
        time.sleep(0.1)
    view = _held(k, number)
    assert (view.worker, view.agent_id, view.holder_offline) == (k["workers"]["b"], "agent-b",
                                                                 False)
    kinds = [e.detail["why"] for e in k["verifier"].events(job=k["job_id"])
             if e.kind == "params_rerouted"]
    assert kinds == [quiet]
    assert [c.challenge for c in k["b"].heartbeat("agent-b", Heartbeat()).challenges] == [number]
    assert [c.challenge for c in k["a"].heartbeat("agent-a", Heartbeat()).challenges] == [number]
    # A late answer of the keeper it left (an upload slower than the timeout) is as good,
    # once checked, as the new holder's.
    k["a" if quiet == "silent" else "b"].answer_challenge(number, k["right"])
    assert k["verifier"].challenge_file(number) == k["right"]
    assert k["b"].heartbeat("agent-b", Heartbeat()).challenges == ()
    assert k["a"].heartbeat("agent-a", Heartbeat()).challenges == ()


def test_asking_again_never_routes_the_challenge_back_to_a_refused_keeper(kept):
    """a lied, and the challenge went to b. The verifier asks again (naming a's worker, even),
    and b's agent goes offline while a's beats on: the challenge stays b's, and a is never
    asked for the step again."""
    k = kept
    _file_records(k)
    number = _asked_of_a(k)
    refused(lambda: k["a"].answer_challenge(number, LIES["another_state"](k["tmp"])), 409)
    (again,) = k["verifier"].raise_challenges(k["job_id"], [
        ChallengeRequest(worker=k["workers"]["a"], step=STEP, kind=BlobKind.params)])
    assert (again.challenge, again.worker, again.agent_id) == (number, k["workers"]["b"],
                                                              "agent-b")
    deadline = time.monotonic() + k["co"].settings.agent_timeout_s + 0.3
    while time.monotonic() < deadline:  # only a beats
        assert k["a"].heartbeat("agent-a", Heartbeat()).challenges == ()
        time.sleep(0.1)
    view = _held(k, number)
    assert (view.agent_id, view.holder_offline) == ("agent-b", True)
    assert k["a"].heartbeat("agent-a", Heartbeat()).challenges == ()
    assert not [e for e in k["verifier"].events(job=k["job_id"]) if e.kind == "params_rerouted"
                and e.detail["to"] == k["workers"]["a"]]


def test_an_honest_keepers_answer_is_taken_as_it_is(kept):
    """No false refusal: the first keeper's right answer is stored, nobody else is asked."""
    k = kept
    _file_records(k)
    number = _asked_of_a(k)
    answered = k["a"].answer_challenge(number, k["right"])
    assert (answered.worker, answered.agent_id) == (k["workers"]["a"], "agent-a")
    assert k["verifier"].challenge_file(number) == k["right"]
    kinds = {e.kind for e in k["verifier"].events(job=k["job_id"])}
    assert not kinds & {"params_refused", "params_rerouted"}
    assert k["b"].heartbeat("agent-b", Heartbeat()).challenges == ()


def test_with_tied_claims_any_readable_answer_is_taken(kept):
    """a and b claim different starts for the step: nobody can tell which is right (the
    verifier finds no majority either), so the coordinator refuses only what does not
    load as parameters, and takes a readable state as sent."""
    k = kept
    _file_records(k, claims={"b": "f" * 64})
    number = _asked_of_a(k)
    refused(lambda: k["a"].answer_challenge(number, LIES["garbage"](k["tmp"])), 409)
    view = _held(k, number)
    assert view.agent_id == "agent-b"  # unreadable is nobody's state: b is asked
    other = LIES["another_state"](k["tmp"])
    assert k["b"].answer_challenge(number, other).answered_at_s is not None
    assert k["verifier"].challenge_file(number) == other


def test_when_both_keepers_lie_no_file_is_served_and_nobody_is_asked_again(kept):
    """Two keepers colluding on a wrong state get nothing served: the challenge stays
    unanswered (the verifier calls the step unavailable, as without any answer), and
    neither agent is asked for it again."""
    k = kept
    _file_records(k)
    number = _asked_of_a(k)
    lie = LIES["another_state"](k["tmp"])
    refused(lambda: k["a"].answer_challenge(number, lie), 409)
    assert "no other keeper" in refused(lambda: k["b"].answer_challenge(number, lie), 409)
    assert _held(k, number).answered_at_s is None
    refused(lambda: k["verifier"].challenge_file(number), 404)
    for n in "ab":
        assert k[n].heartbeat(f"agent-{n}", Heartbeat()).challenges == ()
        refused(lambda: k[n].answer_challenge(number, k["right"]), 403)
