"""Forced errors served through the coordinator, on both stores, tried as the parties
that would game them: a lazy verifier that signs `valid` on everything (caught on a
plant, and slashed on chain at the reveal); an honest one that calls a plant wrong
(never penalised, and no provider slashed, dropped or unpaid for it); a verifier
probing the routes for which records are planted before it files; and a plant's
guilty verdict taken to the referee to slash the provider whose real record it is."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import torch
from eth_account import Account
from sqlalchemy.orm import Session

from shoal.coordinator import Coordinator
from shoal.coordinator.proofs import forced_plans
from shoal.coordinator.services.numbering import FETCH_BASE
from shoal.coordinator.proofs.penalties import LAZY_VERDICT_PENALTY_WEI
from shoal.coordinator.services.settlement import Settlement
from shoal.coordinator.db.schema import JobRow
from shoal.verify.roles.verdicts import sign_verdict
from shoal.ledger import Chain, Ledger
from shoal.proof.forced import ForcedErrors, sealed_root, verify_reveal
from shoal.proof.merkle import epoch_tree, verify_proof
from shoal.spec.audit import ChallengeRequest, RecordUpload, SignedVerdictBody, VerdictFiling
from shoal.spec.coordinator import (
    Grant, Heartbeat, JobStatus, JobSubmission, OfferTerms, Registration, Role,
)
from shoal.spec.ledger import LedgerConfig
from shoal.spec.proof import Verdict, VerdictKind
from shoal.verify.kept_files import reveal_bytes, reveal_from
from shoal.verify.proof_store import contribution_norm, contribution_sha256
from shoal.verify.replay import relative_distance
from tests.coordinator.conftest import Served, make_settings, provider_with_agent
from tests.coordinator.test_proofs import PRICE, PROOF_JOB, publish, record, refused

# With this secret and rate, steps 1, 2 and 3 of the first epoch are planted and 0 and 4
# are not (fixed: the test needs both kinds, whatever os.urandom says).
SECRET = b"forced errors, planted for tests"
RATE, WAIT_S, STAKE = 0.5, 5.0, 10**17


class Clock:
    """Wall time plus what a test advanced: the wait runs out without sleeping."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def contribution(worker: str, step: int) -> list[torch.Tensor]:
    """What the worker contributed to `step`; a verifier's replay gives it back."""
    seed = int.from_bytes(hashlib.sha256(f"{worker}/{step}".encode()).digest()[:4], "big")
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.randn(6, 4, generator=generator)
    embedding[::2] = 0  # rows of tokens the batch did not use: a pattern a screen could check
    return [embedding, torch.randn(4, generator=generator)]


def worker_file(tensors: list[torch.Tensor]) -> bytes:
    """The file as a worker writes it (`ProofStore.save_reveal`)."""
    return reveal_bytes(tensors)


def legacy_worker_file(tensors: list[torch.Tensor], step: int, tmp: Path) -> bytes:
    """The file as a worker wrote it before safetensors: a torch archive."""
    path = tmp / f".{step:09d}.4242.tmp"
    torch.save([t.clone() for t in tensors], path)
    return path.read_bytes()


@pytest.fixture
def chain():
    chain = Chain.embedded()
    owner, operator, referee, *rest = chain.dev_accounts()[:6]
    ledger = Ledger.deploy(chain, owner, operator.address, referee.address,
                           LedgerConfig(min_stake_wei=10**15))
    return ledger, operator, referee, rest


@pytest.fixture
def forced(store_url, operator, monkeypatch, tmp_path, chain):
    """A proof job whose five records of epoch 0 have real contributions, uploaded by
    agent-a; forced errors on; two staked verifiers (lazy and honest) granted."""
    monkeypatch.setattr(forced_plans, "new_secret", lambda: SECRET)
    ledger, chain_operator, referee, (lazy_key, honest_key, *_) = chain
    clock = Clock()
    coordinator = Coordinator(make_settings(store_url, operator, forced_error_rate=RATE,
                                            forced_error_wait_s=WAIT_S, forced_error_window_s=0),
                              clock=clock)
    served = Served(coordinator)
    a = served.client(Account.create())
    submitter = served.client(Account.create())
    lazy, honest = served.client(lazy_key), served.client(honest_key)
    provider_with_agent(a, "agent-a")
    a.post_offer(OfferTerms(offer_id="dev-a", agent_id="agent-a", price_wei_per_s=PRICE))
    submitter.register(Registration(role="submitter", name="alice"))
    job_id = submitter.submit(JobSubmission(name="tiny", job_file=PROOF_JOB, workers=1,
                                            max_price_wei_per_s=2 * PRICE,
                                            budget_wei=10**12)).job_id
    served.app.state.rounds.once()
    (lease,) = submitter.job(job_id).leases
    worker = f"agent-a-l{lease.lease}-a0-w0"
    publish(coordinator, job_id, [worker], "start")
    for name, client in (("lazy", lazy), ("honest", honest)):
        served.client(operator).request("POST", "/v1/grants", Grant(
            address=client.account.address, role=Role.verifier, name=name))
        ledger.stake(client.account, STAKE)
    records = [record(worker, s).model_copy(update={
        "contribution_sha256": contribution_sha256("tiny", worker, s, contribution(worker, s)),
        "contribution_norm": contribution_norm(contribution(worker, s))}) for s in range(5)]
    a.upload_records(job_id, RecordUpload(lease=lease.lease, records=tuple(records)))
    files = {s: worker_file(contribution(worker, s)) for s in range(5)}
    yield Setup(served, coordinator, clock, a, submitter, lazy, honest, job_id, worker,
                records, files, ledger, Settlement(ledger, chain_operator), referee)
    served.stop()
    coordinator.hosts.stop_all()
    coordinator.engine.dispose()


class Setup:
    def __init__(self, served, coordinator, clock, a, submitter, lazy, honest, job_id, worker,
                 records, files, ledger, settlement, referee) -> None:
        self.served, self.co, self.clock = served, coordinator, clock
        self.a, self.submitter = a, submitter
        self.lazy, self.honest, self.job_id, self.worker = lazy, honest, job_id, worker
        self.records, self.files, self.ledger = records, files, ledger
        self.settlement, self.referee = settlement, referee

    def planted_steps(self) -> set[int]:
        plan = ForcedErrors(SECRET, RATE)
        return {r.step for r in self.records if plan.is_planted("tiny", 0, r.step, r.worker)}

    def serve_epoch(self) -> None:
        """Root epoch 0, let agent-a answer the plants' fetches, and publish it."""
        self.a.heartbeat("agent-a", Heartbeat())  # the setup may outlast the 1 s agent
        self.served.app.state.rounds.once()  # timeout under load; a real agent beats on
        for asked in self.a.heartbeat("agent-a", Heartbeat()).challenges:
            self.a.answer_challenge(asked.challenge, self.files[asked.step])
        self.clock.offset += WAIT_S + 0.1
        self.a.heartbeat("agent-a", Heartbeat())  # alive at the advanced time
        self.served.app.state.rounds.once()

    def answer(self, client, steps) -> dict[int, bytes]:
        """`client` challenges the reveals of `steps`; the agent answers at its beat."""
        views = client.raise_challenges(self.job_id, [ChallengeRequest(worker=self.worker, step=s)
                                                      for s in steps])
        for asked in self.a.heartbeat("agent-a", Heartbeat()).challenges:
            self.a.answer_challenge(asked.challenge, self.files[asked.step])
        return {v.step: client.challenge_file(v.challenge) for v in views}

    def file(self, client, kinds: dict[int, VerdictKind]) -> list:
        bodies = []
        for step, kind in kinds.items():
            signed = sign_verdict(Verdict(job="tiny", epoch=0, step=step, worker=self.worker,
                                          kind=kind), client.account)
            bodies.append(SignedVerdictBody(verdict=signed.verdict, signature=signed.signature))
        return client.file_verdicts(self.job_id, VerdictFiling(verdicts=tuple(bodies)))

    def events(self, kind: str) -> list:
        return [e for e in self.lazy.events(job=self.job_id) if e.kind == kind]


def replay_verdicts(s: Setup, client) -> dict[int, VerdictKind]:
    """An honest verifier: every served file must open its served record's commitment, and
    a replay (the worker's true contribution) must match it within the job's tolerance."""
    served = {r.step: r for r in client.work_records(s.job_id, 0)}
    kinds = {}
    for step, data in s.answer(client, range(5)).items():
        revealed = reveal_from(data)
        opened = contribution_sha256("tiny", s.worker, step, revealed)
        assert opened == served[step].contribution_sha256
        distance = relative_distance(contribution(s.worker, step), revealed)
        kinds[step] = VerdictKind.valid if distance <= 1e-3 else VerdictKind.wrong_contribution
    return kinds


def test_a_lazy_verifier_is_caught_on_a_plant_and_the_honest_and_the_provider_are_not(forced):
    s = forced
    planted = s.planted_steps()
    assert planted and planted != set(range(5)), "the test needs plants and real records"
    s.serve_epoch()
    (commit,) = s.events("forced_errors_committed")
    assert commit.detail["rate"] == RATE

    # The lazy verifier signs everything valid; the honest one replays and calls the
    # plants wrong (it cannot tell them from cheats).
    s.file(s.lazy, dict.fromkeys(range(5), VerdictKind.valid))
    kinds = replay_verdicts(s, s.honest)
    assert {step for step, kind in kinds.items() if kind is not VerdictKind.valid} == planted
    s.file(s.honest, kinds)
    s.co.referee.wait()
    # Before the reveal nothing tells a plant: no ruling, no slash, nobody dropped.
    for kind in ("worker_slashed", "verdict_rejected", "verdict_upheld", "forced_error_missed"):
        assert not s.events(kind), kind
    assert all(v.ruling is None for v in s.lazy.verdicts(s.job_id))

    # The job ends; its audits' window passes: the secret is revealed and the lazy verifier
    # pays for every plant it signed, on chain.
    # The referee slashes verifiers' stakes on chain (the job itself is not on chain).
    s.co.penalties.settlement, s.co.penalties.account = s.settlement, s.referee
    s.co.jobs.end(s.submitter.account.address, s.job_id, JobStatus.finished)
    # agent-a is alive: the test's settings lose an agent after 1 s without a beat, and on a
    # loaded machine the filings above took longer (the round then withdrew its offer).
    s.a.heartbeat("agent-a", Heartbeat())
    s.served.app.state.rounds.once()
    (reveal,) = s.events("forced_errors_revealed")
    secret = bytes.fromhex(reveal.detail["secret"])
    assert verify_reveal(commit.detail["commitment"], secret)
    assert {step for _, _, step, state in reveal.detail["plants"] if state == "ready"} == planted
    missed = s.events("forced_error_missed")
    assert sorted(e.detail["step"] for e in missed) == sorted(planted)
    assert {e.detail["verifier"] for e in missed} == {s.lazy.account.address}
    assert all("tx" in e.detail for e in missed), [e.detail for e in missed]
    penalty = LAZY_VERDICT_PENALTY_WEI * len(planted)
    assert s.ledger.stake_of(s.lazy.account.address).active_wei == STAKE - penalty
    assert s.ledger.stake_of(s.honest.account.address).active_wei == STAKE
    rulings = {(v.verdict.verifier, v.verdict.step): v.ruling for v in s.lazy.verdicts(s.job_id)}
    for step in planted:
        assert rulings[(s.lazy.account.address, step)] == "plant_missed"
        assert rulings[(s.honest.account.address, step)] == "plant_caught"
    # The provider whose records were planted is neither slashed nor dropped.
    assert not s.events("worker_slashed") and not s.events("verdict_rejected")
    (offer,) = [o for p in s.a.providers() for o in p.offers if o.offer_id == "dev-a"]
    assert not offer.withdrawn


def test_withheld_filed_before_the_agent_could_answer_catches_no_plant(forced):
    """The lazy verifier's other way: ask for every file and, before the agent's next
    beat, file `withheld` on all of it. Before, a `withheld` counted as catching a plant
    (a share of the missers' stake) with nothing replayed; it says nothing of a plant's
    content, so it now abstains. Filed after the answers, it is refused outright."""
    s = forced
    planted = s.planted_steps()
    s.serve_epoch()
    s.lazy.raise_challenges(s.job_id, [ChallengeRequest(worker=s.worker, step=step)
                                       for step in range(5)])
    s.file(s.lazy, dict.fromkeys(range(5), VerdictKind.withheld))
    s.file(s.honest, replay_verdicts(s, s.honest))  # the agent answers at this beat
    refused(lambda: s.file(s.lazy, {0: VerdictKind.withheld}), 409)
    s.co.referee.wait()
    s.co.penalties.settlement, s.co.penalties.account = s.settlement, s.referee
    s.co.jobs.end(s.submitter.account.address, s.job_id, JobStatus.finished)
    s.a.heartbeat("agent-a", Heartbeat())
    s.served.app.state.rounds.once()
    assert s.events("forced_errors_revealed")
    rulings = {(v.verdict.verifier, v.verdict.step): v.ruling for v in s.lazy.verdicts(s.job_id)}
    for step in planted:
        assert rulings[(s.lazy.account.address, step)] == "plant_abstained"
        assert rulings[(s.honest.account.address, step)] == "plant_caught"
    assert not s.events("forced_error_missed")  # nobody signed a plant valid
    assert not s.events("worker_slashed")  # nor was the provider's real work held against it


def test_a_verifier_cannot_tell_a_plant_from_the_routes_before_it_files(forced):
    s = forced
    planted = s.planted_steps()
    s.served.app.state.rounds.once()  # rooted: plants are being fetched
    # Nothing of the epoch is served or challengeable before it is published.
    assert s.lazy.proof_epochs(s.job_id) == []
    refused(lambda: s.lazy.work_records(s.job_id, 0), 409)
    refused(lambda: s.lazy.raise_challenges(s.job_id, [ChallengeRequest(worker=s.worker, step=2)]),
            409)
    fetches = s.a.heartbeat("agent-a", Heartbeat()).challenges
    assert all(f.challenge >= FETCH_BASE for f in fetches)  # the public list stays gapless
    for asked in fetches:
        s.a.answer_challenge(asked.challenge, s.files[asked.step])
    s.clock.offset += WAIT_S + 0.1
    s.a.heartbeat("agent-a", Heartbeat())
    s.served.app.state.rounds.once()

    (epoch,) = s.lazy.proof_epochs(s.job_id)
    records = s.lazy.work_records(s.job_id, 0)
    tree, ordered = epoch_tree(records)
    assert epoch.root == "0x" + tree.root.hex()  # every served record, plants too, is proven
    for i, r in enumerate(ordered):
        assert verify_proof(r.leaf(), i, tree.count, tree.proof(i), tree.root)
    one_plant, one_real = min(planted), min(set(range(5)) - planted)
    views = s.lazy.raise_challenges(s.job_id, [ChallengeRequest(worker=s.worker, step=step)
                                               for step in (one_plant, one_real)])
    assert [v.answered_at_s for v in views] == [None, None]  # both wait for the agent's beat
    files = s.answer(s.lazy, (one_plant, one_real))
    answered = {v.step: v for v in s.lazy.challenges(s.job_id)}
    assert [c.challenge for c in s.lazy.challenges(s.job_id)] == \
        list(range(views[0].challenge, views[0].challenge + 2))
    plant_view, real_view = answered[one_plant], answered[one_real]
    assert plant_view.model_dump().keys() == real_view.model_dump().keys()
    assert {k for k, v in plant_view.model_dump().items() if v is None} == \
        {k for k, v in real_view.model_dump().items() if v is None}
    for step, data in files.items():
        assert hashlib.sha256(data).hexdigest() == answered[step].sha256
        # Laid out as the worker wrote it: its header, byte for byte.
        size = int.from_bytes(data[:8], "little")
        assert data[:8 + size] == s.files[step][:8 + size]
        assert len(data) == len(s.files[step])
    plant = reveal_from(files[one_plant])
    real = contribution(s.worker, one_plant)
    assert torch.equal(plant[0] == 0, real[0] == 0)  # the sparse rows stay sparse
    assert relative_distance(real, plant) > 3e-3  # yet a replay shows it wrong
    sizes = {e.detail["challenge"]: e.detail["bytes"] for e in s.events("challenge_answered")}
    assert sizes[plant_view.challenge] == len(files[one_plant])


def test_a_plants_guilty_verdict_cannot_slash_its_provider_through_the_referee(forced):
    s = forced
    planted = s.planted_steps()
    s.serve_epoch()
    s.co.referee.withheld_grace_s = 0.0
    step = min(planted)
    # Accused as wrong, and as withheld while its agent beats without answering: the
    # worker whose real record it is must lose nothing either way.
    s.honest.raise_challenges(s.job_id, [ChallengeRequest(worker=s.worker, step=step)])
    s.clock.offset += 1.0
    s.a.heartbeat("agent-a", Heartbeat())
    filed = s.file(s.honest, {step: VerdictKind.withheld}) + \
        s.file(s.lazy, {step: VerdictKind.wrong_contribution})
    s.co.referee.wait()
    for view in filed:
        assert s.co.referee.rule(s.job_id, view.seq) == "plant"  # asked again, directly
    assert not s.events("worker_slashed") and not s.events("verdict_rejected")
    assert all(v.ruling is None for v in s.lazy.verdicts(s.job_id))
    (offer,) = [o for p in s.a.providers() for o in p.offers if o.offer_id == "dev-a"]
    assert not offer.withdrawn
    # A real record's guilty verdict is still ruled on as before.
    real = min(set(range(5)) - planted)
    (accused,) = s.file(s.lazy, {real: VerdictKind.wrong_params})
    s.co.referee.wait()
    assert {v.seq: v.ruling for v in s.lazy.verdicts(s.job_id)}[accused.seq] is not None


def test_the_chain_anchor_tells_no_verifier_which_epochs_hold_plants(forced, chain):
    """The served root differs from the workers' root wherever an epoch holds a plant; the
    chain holds neither, but the workers' root sealed with a salt revealed after the job."""
    s = forced
    _, _, _, rest = chain
    chain_job = s.ledger.create_job(rest[2], 2 * PRICE, 10**15).returned
    with Session(s.co.engine) as session, session.begin():
        session.get(JobRow, s.job_id).chain_job = chain_job
    s.co.records.settlement = s.settlement  # the epoch is anchored as it is rooted
    assert s.planted_steps(), "the test needs a plant in epoch 0"
    s.serve_epoch()
    (served,) = s.lazy.proof_epochs(s.job_id)  # what a verifier sees
    (anchor,) = s.ledger.anchors(chain_job)
    workers_root = s.co.records.proof_epochs(s.job_id)[0].root
    assert served.anchored_root == anchor.root
    assert anchor.root not in (workers_root, served.root)
    assert served.root != workers_root  # the plant: a verifier comparing would have known

    # Once the job is over and the secret revealed, anyone checks what was anchored.
    s.co.jobs.end(s.submitter.account.address, s.job_id, JobStatus.finished)
    s.served.app.state.rounds.once()
    (reveal,) = s.events("forced_errors_revealed")
    salt = ForcedErrors(bytes.fromhex(reveal.detail["secret"]), RATE).anchor_salt(s.job_id, 0)
    assert "0x" + sealed_root(bytes.fromhex(workers_root[2:]), salt).hex() == anchor.root
