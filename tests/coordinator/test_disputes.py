"""Disputes brought through the coordinator by a bonded challenger, on the embedded
chain, with the job's real model replayed by the referee: tried as the parties that
would game them. A cheat disputed is slashed on chain at the step it cheated; a false
accuser loses its bond wherever its trajectory points; someone else's dispute, a
malformed trajectory or a dispute that does not exist is refused; and a verifier
cannot have an honest record ruled `withheld` by accusing one nobody asked for."""

from __future__ import annotations

import time
import tomllib

import pytest
from eth_account import Account

from shoal.agent import Agent, AgentConfig, ChainPin
from shoal.coordinator import Coordinator
from shoal.coordinator.services.settlement import Settlement
from shoal.verify.roles.dispute import trajectory
from shoal.verify.roles.verdicts import sign_verdict
from shoal.models.gpt_replay import gpt_replayer
from shoal.ledger import Chain, Ledger, LedgerError
from shoal.spec.audit import (
    BlobKind, ChallengeRequest, DisputeFiling, RecordUpload, SignedVerdictBody, VerdictFiling,
)
from shoal.spec.coordinator import Grant, Heartbeat, Role
from shoal.spec.jobfile import parse_job
from shoal.spec.ledger import DisputeState, LedgerConfig
from shoal.spec.proof import Verdict, VerdictKind
from tests.coordinator.conftest import Served, make_settings
from tests.coordinator.replayable import replayable
from tests.coordinator.test_proofs import PROOF_JOB, publish, refused
from tests.coordinator.test_settlement import BUDGET, PRICE, leased_and_hosted

# Each test here trains or hosts a job and runs a chain and a coordinator (over 5 s on
# two cores): out of `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

CHEAT_STEP, BOND = 3, 10**15


class Disputed:
    """A one-worker proof job on chain whose epoch 0 (steps 0-4) is rooted: provider
    p1's worker cheated at step 3 (a contribution scaled ×4, committed as sent)."""

    def __init__(self, tmp_path, cheat: frozenset[int] = frozenset({CHEAT_STEP}),
                 chain: Chain | None = None, **settings) -> None:
        """`chain`: the embedded one by default (a node's, for a CLI in its own process)."""
        chain = chain or Chain.embedded()
        owner, operator, referee, alice, mallory, p1, p2, vera = chain.dev_accounts()[:8]
        self.ledger = Ledger.deploy(chain, owner, operator.address, referee.address,
                                    LedgerConfig(min_stake_wei=10**15))
        for provider in (p1, p2):
            self.ledger.stake(provider, 10**18)
        self.ledger.stake(vera, 10**17)
        self.co = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db", operator, **settings),
                              settlement=Settlement(self.ledger, operator), referee_key=referee,
                              replayer=gpt_replayer)
        self.co.disputes.fetch_wait_s = 10.0
        self.served = Served(self.co)
        self.mallory, self.p1, self.vera_key, self.operator = mallory, p1, vera, operator
        self.tmp = tmp_path
        submitter = self.served.client(alice)
        self.chain_job = self.ledger.create_job(alice, 2 * PRICE, BUDGET).returned
        providers, job = leased_and_hosted(self.served, submitter, (p1, p2), self.chain_job,
                                           PROOF_JOB)
        self.job_id, self.a = job.job_id, providers["a"]
        for name, client in providers.items():
            reply = client.heartbeat(name, Heartbeat())
            Agent(client, AgentConfig(agent_id=name, work_dir=tmp_path / name,
                                      chain=ChainPin.of(self.ledger)))._accept(
                reply.assignments)
        self.lease = {lease.offer_id: lease.lease for lease in submitter.job(self.job_id).leases}
        self.worker = f"a-l{self.lease['a-d0']}-a0-w0"
        publish(self.co, self.job_id, [self.worker], "start")
        spec = parse_job(tomllib.loads(PROOF_JOB), source="test")
        self.work = replayable(spec, self.worker, range(5), cheat=set(cheat))
        self.a.upload_records(self.job_id, RecordUpload(lease=self.lease["a-d0"],
                                                        records=tuple(self.work.records)))
        for name, client in providers.items():  # the replay above may outlast the 1 s
            client.heartbeat(name, Heartbeat())  # agent timeout; a real agent beats on
        self.served.app.state.rounds.once()
        if self.co.plants.forced_errors_on:  # the plants' fetches answered, the epoch is served
            self.answer_until(lambda: self.a.proof_epochs(self.job_id), timeout_s=30.0,
                              tick=self.served.app.state.rounds.once)
        (epoch,) = self.a.proof_epochs(self.job_id)
        self.root = bytes.fromhex(epoch.root[2:])

    def close(self) -> None:
        self.served.stop()
        self.co.hosts.stop_all()

    def states(self, rejects: set[int]) -> tuple[str, ...]:
        return tuple(trajectory(self.root, self.work.records, lambda r: r.step not in rejects))

    def answer_until(self, done, timeout_s: float = 60.0, tick=lambda: None) -> None:
        """Agent a answers what it is asked (its worker's files), beating, until `done()`."""
        deadline = time.monotonic() + timeout_s
        while not done():
            tick()
            assert time.monotonic() < deadline, "the referee did not rule"
            for asked in self.a.heartbeat("a", Heartbeat()).challenges:
                data = self.work.params if asked.kind is BlobKind.params \
                    else self.work.reveals[asked.step]
                self.a.answer_challenge(asked.challenge, data)
                self.a.heartbeat("a", Heartbeat())  # answers may outlast the 1 s agent timeout
            time.sleep(0.2)

    def ruled(self, dispute: int):
        views = [d for d in self.a.disputes(self.job_id) if d.dispute == dispute]
        return views[0] if views and views[0].ruling else None


@pytest.fixture
def disputed(tmp_path):
    setup = Disputed(tmp_path)
    yield setup
    setup.close()


def test_a_cheat_disputed_is_slashed_at_the_step_it_cheated(disputed):
    s = disputed
    dispute = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
    challenger = s.served.client(s.mallory)
    filed = challenger.file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=0, trajectory=s.states({CHEAT_STEP})))
    assert filed.provider == s.p1.address and filed.ruling is None
    s.answer_until(lambda: s.ruled(dispute))
    view = s.ruled(dispute)
    assert (view.ruling, view.step) == ("upheld", CHEAT_STEP), view.why
    assert view.rounds == 3 and view.tx  # ⌈log2 5⌉ rounds, one replay, one transaction
    assert view.chain_state == "upheld"
    assert s.ledger.dispute(dispute).state is DisputeState.upheld
    assert s.ledger.lease(s.chain_job, s.p1.address).slashed
    withdrawn = [e.detail["offer_id"] for e in challenger.events(job=None)
                 if e.kind == "offer_withdrawn" and "dispute" in e.detail["reason"]]
    assert withdrawn == ["a-d0"]  # the cheat's provider leaves the job; b stays
    # ...and is barred from it: a re-posted offer must not lease it straight back.
    (barred,) = [e for e in challenger.every_event(job=s.job_id)
                 if e.kind == "provider_barred"]
    assert barred.detail["provider"].lower() == s.p1.address.lower()
    assert f"slashed in dispute {dispute}" in barred.detail["reason"]
    # The same dispute cannot be brought twice.
    assert "brought already" in refused(lambda: challenger.file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=0, trajectory=s.states({CHEAT_STEP}))), 409)


def test_a_disputed_cheat_that_beats_on_without_answering_is_slashed_not_waited_out(disputed):
    """The cheat's agent stays alive but never hands over the step's contribution. The
    referee waits until its silence counts as withholding (seen alive past the grace
    after the challenge), however short the fetch wait: ruling at the fetch wait would
    have left the dispute `undecided`, the bond back and the cheat unslashed."""
    s = disputed

    def params_only() -> None:  # beats, and hands over the parameters, never the contribution
        for asked in s.a.heartbeat("a", Heartbeat()).challenges:
            if asked.kind is BlobKind.params:
                s.a.answer_challenge(asked.challenge, s.work.params)

    dispute, view = _short_waited_dispute(s, params_only)
    assert (view.ruling, view.step) == ("upheld", CHEAT_STEP), view.why
    assert "withheld" in view.why
    assert s.ledger.lease(s.chain_job, s.p1.address).slashed


def test_a_disputed_provider_whose_agent_went_silent_is_not_slashed_for_it(disputed):
    """The other side of the rule above: an agent that has not beaten since the dispute
    asked for its files (its machine died) is not waited for past the fetch wait, and
    its silence is not withholding: the dispute is `undecided` (it expires on chain,
    bond back) and the provider keeps its stake."""
    s = disputed
    dispute, view = _short_waited_dispute(s, lambda: None)  # agent a never beats
    assert view.ruling == "undecided", view.why  # nothing of the step came: not ruled
    assert not s.ledger.lease(s.chain_job, s.p1.address).slashed
    assert s.ledger.dispute(dispute).state is DisputeState.open


def _short_waited_dispute(s: Disputed, agent_a) -> tuple:
    """Mallory disputes the cheat's epoch with a fetch wait (0.5 s) far shorter than the
    referee's grace (3 s), while `agent_a()` plays lease a's agent: (dispute, its ruling)."""
    s.co.disputes.fetch_wait_s, s.co.referee.withheld_grace_s = 0.5, 3.0
    dispute = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
    s.served.client(s.mallory).file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=0, trajectory=s.states({CHEAT_STEP})))
    deadline = time.monotonic() + 60
    while not s.ruled(dispute):
        assert time.monotonic() < deadline, "the referee did not rule"
        agent_a()
        time.sleep(0.2)
    return dispute, s.ruled(dispute)


@pytest.mark.parametrize("accused", [1, 4])
def test_a_false_accuser_loses_its_bond_wherever_it_points(disputed, accused):
    """The challenger rejects an honest step (and, with 4, also accepts the cheat's):
    the bisection lands on the step it rejects first, the replay matches, it loses."""
    s = disputed
    dispute = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
    rejects = {accused}
    s.served.client(s.mallory).file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=0, trajectory=s.states(rejects)))
    s.answer_until(lambda: s.ruled(dispute))
    view = s.ruled(dispute)
    assert (view.ruling, view.step) == ("rejected", accused), view.why
    assert s.ledger.dispute(dispute).state is DisputeState.rejected
    assert not s.ledger.lease(s.chain_job, s.p1.address).slashed


def test_only_the_disputes_own_challenger_with_a_whole_trajectory_is_heard(disputed):
    s = disputed
    dispute = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
    good = s.states({CHEAT_STEP})
    stranger = s.served.client(Account.create())  # not the key that bonded the dispute
    assert "not by you" in refused(lambda: stranger.file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=0, trajectory=good)), 403)
    mallory = s.served.client(s.mallory)
    assert "6 states" in refused(lambda: mallory.file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=0, trajectory=good[:-1])), 409)
    assert "open_dispute" in refused(lambda: mallory.file_dispute(s.job_id, DisputeFiling(
        dispute=dispute + 7, worker=s.worker, epoch=0, trajectory=good)), 404)
    assert "not served yet" in refused(lambda: mallory.file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=1, trajectory=good)), 409)
    # A trajectory that starts elsewhere disputes a claim nobody made: it loses.
    forged = ("0" * 64,) + good[1:]
    mallory.file_dispute(s.job_id, DisputeFiling(dispute=dispute, worker=s.worker, epoch=0,
                                                 trajectory=forged))
    s.co.referee.wait()
    view = s.ruled(dispute)
    assert view.ruling == "rejected" and "bisect the same records" in view.why
    assert s.ledger.dispute(dispute).state is DisputeState.rejected


def test_an_accusation_of_a_record_nobody_asked_for_is_not_ruled_withheld(disputed):
    """The attack: a verifier fetches step 2's parameters (a real challenge), never asks
    for the worker's contribution, and files `wrong_contribution` on it. The referee's
    replay finds no contribution revealed; that is the worker's fault only if it was
    asked, so the accusation is rejected (before, it was upheld as `withheld`)."""
    s = disputed
    vera = s.served.client(s.vera_key)
    s.served.client(s.operator).request(
        "POST", "/v1/grants", Grant(address=vera.account.address, role=Role.verifier, name="v"))
    (asked,) = vera.raise_challenges(s.job_id, [ChallengeRequest(worker=s.worker, step=2,
                                                                 kind=BlobKind.params)])
    s.answer_until(lambda: all(c.answered_at_s for c in vera.challenges(s.job_id)))
    signed = sign_verdict(Verdict(job="tiny", epoch=0, step=2, worker=s.worker,
                                  kind=VerdictKind.wrong_contribution), vera.account)
    (filed,) = vera.file_verdicts(s.job_id, VerdictFiling(verdicts=(SignedVerdictBody(
        verdict=signed.verdict, signature=signed.signature),)))
    s.co.referee.wait()
    (ruled,) = [v for v in vera.verdicts(s.job_id) if v.seq == filed.seq]
    assert ruled.ruling == "rejected"
    assert not s.ledger.lease(s.chain_job, s.p1.address).slashed



def test_a_dispute_that_lands_on_a_forced_error_is_not_ruled(tmp_path, monkeypatch):
    """A planted record (the operator's, served scaled) is wrong, and a challenger that
    disputes it is right; but the provider did nothing, and a ruling would tell the
    challenger which records are plants (a lazy verifier could probe for them with a
    fabricated trajectory, its bond back when the dispute expires). So no ruling, no
    slash: the dispute stays open on chain until it expires."""
    s, _, served, dispute = _plant_disputed(tmp_path, monkeypatch)
    root = s.root
    try:
        # The referee does rule where the bisection lands on the worker's own record:
        # the cheat's step (not a plant with this secret).
        other = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
        states = tuple(trajectory(root, served, lambda r: r.step != CHEAT_STEP))
        s.served.client(s.mallory).file_dispute(s.job_id, DisputeFiling(
            dispute=other, worker=s.worker, epoch=0, trajectory=states))
        s.answer_until(lambda: s.ruled(other))
        view = s.ruled(other)
        assert (view.ruling, view.step) == ("upheld", CHEAT_STEP)
        # The contract decides a lease's disputes oldest first, and the plant's waits
        # unruled: the referee slashes directly, which closes both (bonds back) and
        # rewards this challenger.
        assert "slashed directly" in view.why and view.tx and view.chain_state == "superseded"
        assert s.ledger.lease(s.chain_job, s.p1.address).slashed
        assert s.ledger.dispute(dispute).state is DisputeState.superseded
    finally:
        s.close()


FORCED_SECRET = b"forced errors, planted for tests"  # plants steps 1 and 4 of this worker


def _plant_disputed(tmp_path, monkeypatch):
    """Forced errors on; a dispute filed whose bisection lands on a plant, left unruled."""
    from shoal.coordinator.proofs import forced_plans
    from shoal.proof.forced import ForcedErrors

    monkeypatch.setattr(forced_plans, "new_secret", lambda: FORCED_SECRET)
    s = Disputed(tmp_path, forced_error_rate=0.5, forced_error_wait_s=0.5)
    plan = ForcedErrors(FORCED_SECRET, 0.5)
    planted = sorted(r.step for r in s.work.records if plan.is_planted("tiny", 0, r.step, r.worker))
    assert planted == [1, 4] and CHEAT_STEP not in planted, planted
    served = s.a.work_records(s.job_id, 0)
    dispute = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
    states = tuple(trajectory(s.root, served, lambda r: r.step != planted[0]))
    s.served.client(s.mallory).file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=0, trajectory=states))
    s.co.referee.wait()
    (view,) = s.a.disputes(s.job_id)
    assert view.ruling is None and view.step is None
    assert s.ledger.dispute(dispute).state is DisputeState.open
    assert not s.ledger.lease(s.chain_job, s.p1.address).slashed
    return s, plan, served, dispute


def test_a_false_accusation_behind_an_unruled_dispute_still_costs_its_bond(tmp_path, monkeypatch):
    """The contract decides a lease's disputes oldest first; a false accusation filed
    behind one left unruled (on a plant) is ruled here at once and taken to the chain
    as soon as the older one is decided or expires, so waiting does not save its bond."""
    s, _, served, plant_dispute = _plant_disputed(tmp_path, monkeypatch)
    try:
        false = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
        states = tuple(trajectory(s.root, served, lambda r: r.step != 2))  # an honest step
        s.served.client(s.mallory).file_dispute(s.job_id, DisputeFiling(
            dispute=false, worker=s.worker, epoch=0, trajectory=states))
        s.answer_until(lambda: s.ruled(false))
        view = s.ruled(false)
        assert view.ruling == "rejected" and view.chain_state == "behind" and "earlier" in view.why
        s.co.disputes.enforce_rulings()
        assert s.ledger.dispute(false).state is DisputeState.open  # still behind the plant's
        s.ledger.chain.advance_time(s.ledger.config().dispute_timeout_s + 1)
        s.ledger.expire_dispute(s.mallory, plant_dispute)  # the plant's: bond back
        s.co.disputes.enforce_rulings()
        assert s.ledger.dispute(false).state is DisputeState.rejected
        assert s.ruled(false).chain_state == "rejected"
    finally:
        s.close()


def test_a_dispute_nobody_files_is_rejected_unheard_and_the_one_behind_it_then_decided(tmp_path):
    """Mallory opens a dispute on p1's lease and never files it, then files a false one
    behind it: the contract decides a lease's disputes oldest first, so the false one's
    ruling waits, and p1's pay with it, until the unfiled one expires (days). Past the
    grace the referee rejects the unfiled one unheard (its bond to the treasury); the
    ruling behind it reaches the chain next round; a filing past the grace is refused."""
    grace_s = 600
    s = Disputed(tmp_path, unfiled_dispute_grace_s=grace_s)
    try:
        unfiled = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
        false = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
        mallory = s.served.client(s.mallory)
        mallory.file_dispute(s.job_id, DisputeFiling(dispute=false, worker=s.worker, epoch=0,
                                                     trajectory=s.states({1})))
        s.answer_until(lambda: s.ruled(false))
        assert (s.ruled(false).ruling, s.ruled(false).chain_state) == ("rejected", "behind")
        s.ledger.chain.advance_time(grace_s + 1)
        for _ in range(2):  # the unfiled one rejected; then the ruling behind it enforced
            s.served.app.state.rounds.once()
        assert s.ledger.dispute(unfiled).state is DisputeState.rejected
        assert s.ledger.dispute(false).state is DisputeState.rejected
        assert s.ruled(false).chain_state == "rejected"
        assert not s.ledger.lease(s.chain_job, s.p1.address).disputed
        assert "rejected on chain" in refused(lambda: mallory.file_dispute(
            s.job_id, DisputeFiling(dispute=unfiled, worker=s.worker, epoch=0,
                                    trajectory=s.states({CHEAT_STEP}))), 409)
        # Filed late, even before the referee got to it: refused, not heard.
        late = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
        s.ledger.chain.advance_time(grace_s + 1)
        assert "rejects it unheard" in refused(lambda: mallory.file_dispute(
            s.job_id, DisputeFiling(dispute=late, worker=s.worker, epoch=0,
                                    trajectory=s.states({CHEAT_STEP}))), 409)
    finally:
        s.close()


def _challenge(s: Disputed):
    """The challenger's side as `shoal dispute` runs it, on a thread while agent a
    answers: replay every record of the worker's epoch through the coordinator, and
    only if a step fails, bond a dispute on the contract, file it, wait for the ruling."""
    import threading

    from shoal.verify.roles.challenger import challenge_worker
    from shoal.verify.roles.remote import RemoteAudits
    from shoal.spec import hyper_digest
    from shoal.verify.audit.record import Auditor
    from shoal.verify.proof_store import ProofStore

    s.served.client(s.operator).request("POST", "/v1/grants", Grant(
        address=s.mallory.address, role=Role.verifier, name="mallory"))
    client = s.served.client(s.mallory)
    spec = parse_job(tomllib.loads(PROOF_JOB), source="test")
    auditor = Auditor(ProofStore(s.tmp / "challenger"), gpt_replayer(spec),
                      hyper_sha256=hyper_digest(spec.hyperparameters()),
                      tolerance=spec.proof.tolerance, verifier=s.mallory.address)
    audits = RemoteAudits(client, s.job_id, spec, auditor, s.mallory, salt=b"m",
                          answer_wait_s=30.0, poll_s=0.1)
    found = []
    s.a.heartbeat("a", Heartbeat())  # back before it is asked: else its challenges drop
    challenger = threading.Thread(target=lambda: found.append(challenge_worker(
        client, s.ledger, s.mallory, audits, s.job_id, s.worker, 0, BOND, ruling_wait_s=60.0,
        poll_s=0.2)))
    challenger.start()
    s.answer_until(lambda: not challenger.is_alive())
    (challenge,) = found
    return challenge


def test_the_challengers_own_replays_find_the_step_and_win_the_dispute(disputed):
    s = disputed
    challenge = _challenge(s)
    assert sorted(v.step for v in challenge.verdicts if v.guilty) == [CHEAT_STEP]
    assert len(challenge.verdicts) == 5
    view = challenge.dispute
    assert (view.ruling, view.step, view.chain_state) == ("upheld", CHEAT_STEP, "upheld")
    assert s.ledger.lease(s.chain_job, s.p1.address).slashed


def test_a_dispute_filed_before_a_restart_is_ruled_after_it(disputed, monkeypatch):
    """The referee's queue is memory: a coordinator that stops between a filing and its
    ruling takes the unruled disputes back to the referee when it starts."""
    s = disputed
    queued = s.co.referee.later
    monkeypatch.setattr(s.co.referee, "later", lambda ruling: None)  # the queue is lost
    dispute = s.ledger.open_dispute(s.mallory, s.chain_job, s.p1.address, BOND).returned
    s.served.client(s.mallory).file_dispute(s.job_id, DisputeFiling(
        dispute=dispute, worker=s.worker, epoch=0, trajectory=s.states({CHEAT_STEP})))
    s.co.referee.wait()
    assert s.ruled(dispute) is None
    monkeypatch.setattr(s.co.referee, "later", queued)
    s.a.heartbeat("a", Heartbeat())  # its agent is online (else the files are not waited for)
    s.co.disputes.requeue_unruled()  # what a starting coordinator does
    s.answer_until(lambda: s.ruled(dispute))
    assert (s.ruled(dispute).ruling, s.ruled(dispute).step) == ("upheld", CHEAT_STEP)


def test_a_challenger_whose_replays_pass_spends_no_bond(tmp_path):
    s = Disputed(tmp_path, cheat=frozenset())
    try:
        challenge = _challenge(s)
        assert len(challenge.verdicts) == 5 and not any(v.guilty for v in challenge.verdicts)
        assert challenge.dispute is None
        with pytest.raises(LedgerError):  # no dispute was opened on chain
            s.ledger.dispute(1)
    finally:
        s.close()
