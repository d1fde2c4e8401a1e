"""The coordinator settling on a chain (the embedded EVM): a job's escrow is
checked there before it is taken, providers accept their chain leases by
signature, and at the job's end the chain books and settles what the store
metered, never more; each move an attacker could make is refused."""

from __future__ import annotations

import time

import pytest

from shoal.agent import Agent, AgentConfig, ChainPin
from shoal.client.http import CoordinatorRefused
from shoal.coordinator import Coordinator
from shoal.coordinator.services.settlement import Settlement
from shoal.ledger import Chain, Ledger
from shoal.ledger.acceptance import sign_acceptance
from shoal.spec.audit import RecordUpload
from shoal.spec.coordinator import Heartbeat, JobStatus, JobSubmission, OfferTerms, Registration
from shoal.spec.ledger import LedgerConfig
from tests.coordinator.conftest import (
    TINY_JOB, Served, make_settings, provider_with_agent,
)
from tests.coordinator.test_proofs import PROOF_JOB, host_reached, publish, record

# Each test here trains or hosts a job and runs a chain and a coordinator (over 5 s on
# two cores): out of `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

PRICE = 1_000_000
BUDGET = 10**12


@pytest.fixture
def market(tmp_path):
    chain = Chain.embedded()
    owner, operator, referee, alice, mallory, p1, p2 = chain.dev_accounts()[:7]
    ledger = Ledger.deploy(chain, owner, operator.address, referee.address,
                           LedgerConfig(min_stake_wei=10**15))
    for provider in (p1, p2):
        ledger.stake(provider, 10**18)
    coordinator = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db"),
                              settlement=Settlement(ledger, operator))
    served = Served(coordinator)
    yield served, ledger, (alice, mallory, p1, p2)
    served.stop()
    coordinator.hosts.stop_all()


def submission(chain_job, budget=BUDGET, max_price=2 * PRICE, job_file=TINY_JOB):
    return JobSubmission(name="tiny", job_file=job_file, workers=2, max_price_wei_per_s=max_price,
                         budget_wei=budget, chain_job=chain_job)


def test_a_job_is_taken_only_with_its_own_escrow_on_chain(market):
    served, ledger, (alice, mallory, *_) = market
    alice_job = ledger.create_job(alice, 2 * PRICE, BUDGET).returned
    clients = {who: served.client(account) for who, account in (("alice", alice), ("mallory", mallory))}
    for who, client in clients.items():
        client.register(Registration(role="submitter", name=who))
    refused = [
        lambda: clients["mallory"].submit(submission(alice_job)),  # alice's escrow
        lambda: clients["alice"].submit(submission(alice_job, budget=BUDGET + 1)),  # more than held
        lambda: clients["alice"].submit(submission(alice_job, max_price=3 * PRICE)),  # above its cap
        lambda: clients["alice"].submit(submission(None)),  # no escrow named
    ]
    for attempt in refused:
        with pytest.raises(CoordinatorRefused) as error:
            attempt()
        assert error.value.status == 409
    assert clients["alice"].jobs() == []
    job = clients["alice"].submit(submission(alice_job))
    assert job.chain_job == alice_job
    with pytest.raises(CoordinatorRefused, match="fund it first"):
        clients["alice"].top_up(job.job_id, 1)  # the chain escrow does not cover it
    ledger.fund(alice, alice_job, 5)
    assert clients["alice"].top_up(job.job_id, 5).budget_wei == BUDGET + 5


def leased_and_hosted(served, submitter, accounts, chain_job, job_file=TINY_JOB):
    """Providers a and b (one agent, one offer each) leased to a new chain job whose host
    serves; returns their clients and the job."""
    submitter.register(Registration(role="submitter", name="alice"))
    providers = {}
    for name, account in zip("ab", accounts):
        client = served.client(account)
        provider_with_agent(client, name)
        client.post_offer(OfferTerms(offer_id=f"{name}-d0", agent_id=name, price_wei_per_s=PRICE))
        providers[name] = client
    job = submitter.submit(submission(chain_job, job_file=job_file))
    deadline = time.monotonic() + 60
    while not submitter.job(job.job_id).rendezvous:  # its job host starts serving
        assert time.monotonic() < deadline
        for name, client in providers.items():
            client.heartbeat(name, Heartbeat())
        served.app.state.rounds.once()
        time.sleep(0.2)
    return providers, job


def test_providers_accept_by_signature_and_the_chain_pays_what_the_store_metered(market, tmp_path):
    served, ledger, (alice, _, p1, p2) = market
    chain_job = ledger.create_job(alice, 2 * PRICE, BUDGET).returned
    submitter = served.client(alice)
    providers, job = leased_and_hosted(served, submitter, (p1, p2), chain_job)
    replies = {name: client.heartbeat(name, Heartbeat()) for name, client in providers.items()}
    (a_assignment,) = replies["a"].assignments
    terms = a_assignment.acceptance
    assert terms.chain_job == chain_job and terms.price_wei_per_s == PRICE

    # b cannot accept a's lease, and a cannot sign itself a better price.
    with pytest.raises(CoordinatorRefused) as error:
        providers["b"].accept_lease(a_assignment.lease.lease, sign_acceptance(
            p2, terms.chain_id, terms.contract, chain_job, PRICE, terms.term_s, terms.deadline))
    assert error.value.status == 403
    with pytest.raises(CoordinatorRefused) as error:
        providers["a"].accept_lease(a_assignment.lease.lease, sign_acceptance(
            p1, terms.chain_id, terms.contract, chain_job, 2 * PRICE, terms.term_s, terms.deadline))
    assert error.value.status == 409
    with pytest.raises(CoordinatorRefused) as error:  # terms for another chain job
        providers["a"].accept_lease(a_assignment.lease.lease, sign_acceptance(
            p1, terms.chain_id, terms.contract, chain_job + 1, PRICE, terms.term_s, terms.deadline))
    assert error.value.status == 409
    assert ledger.lease(chain_job, p1.address).accepted_at == 0

    for name, client in providers.items():  # the agents' own code signs the offered terms
        Agent(client, AgentConfig(agent_id=name, work_dir=tmp_path / name,
                                      chain=ChainPin.of(ledger)))._accept(
            replies[name].assignments)
    assert all(ledger.lease(chain_job, p.address).accepted_at for p in (p1, p2))
    assert providers["a"].heartbeat("a", Heartbeat()).assignments[0].acceptance is None

    # Both leases' workers are in the job (as its host publishes them): both are paid.
    leases = {lease.offer_id: lease.lease for lease in submitter.job(job.job_id).leases}
    publish(served.app.state.coordinator, job.job_id,
            [f"a-l{leases['a-d0']}-a0-w0", f"b-l{leases['b-d0']}-a0-w0"], "start")
    time.sleep(3)
    ledger.chain.advance_time(3)  # blocks were mined at acceptance; let chain time pass too
    ended = submitter.job_action(job.job_id, "cancel")
    assert ended.status is JobStatus.cancelled
    (settled,) = [e for e in submitter.events(job=job.job_id) if e.kind == "job_settled"]
    escrow = ledger.job(chain_job)
    assert escrow.settled_at > 0
    paid = 0
    for account in (p1, p2):
        lease = ledger.lease(chain_job, account.address)
        booked = settled.detail["seconds"][account.address]
        assert lease.verified_s == booked > 0  # the store and the chain agree
        assert lease.earned_wei == int(settled.detail["wei"][account.address])
        assert lease.earned_wei <= int(settled.detail["metered_wei"][account.address])  # never more
        paid += lease.earned_wei
    assert escrow.owed_wei == paid
    metered = sum(int(w) for w in settled.detail["metered_wei"].values())
    assert paid <= metered <= ended.spent_wei


def test_a_lease_whose_worker_never_joins_is_ended_and_never_paid(tmp_path):
    """Squatting: provider b's agent beats and reports its lease running, but no worker of
    it ever joins the job. After the grace its lease ends (its offer withdrawn), and at
    settlement it books nothing; a, whose worker is in the job, is paid."""
    chain = Chain.embedded()
    owner, operator, referee, alice, _, p1, p2 = chain.dev_accounts()[:7]
    ledger = Ledger.deploy(chain, owner, operator.address, referee.address,
                           LedgerConfig(min_stake_wei=10**15))
    for provider in (p1, p2):
        ledger.stake(provider, 10**18)
    coordinator = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db", member_grace_s=1.0),
                              settlement=Settlement(ledger, operator))
    served = Served(coordinator)
    try:
        chain_job = ledger.create_job(alice, 2 * PRICE, BUDGET).returned
        submitter = served.client(alice)
        providers, job = leased_and_hosted(served, submitter, (p1, p2), chain_job)
        leases = {lease.offer_id: lease.lease for lease in submitter.job(job.job_id).leases}
        for name, client in providers.items():
            reply = client.heartbeat(name, Heartbeat(running=(leases[f"{name}-d0"],)))
            Agent(client, AgentConfig(agent_id=name, work_dir=tmp_path / name,
                                      chain=ChainPin.of(ledger)))._accept(
                reply.assignments)
        publish(coordinator, job.job_id, [f"a-l{leases['a-d0']}-a0-w0"], "start")

        time.sleep(1.5)  # past the grace; b keeps beating, its lease "running"
        for name, client in providers.items():
            client.heartbeat(name, Heartbeat(running=(leases[f"{name}-d0"],)))
        served.app.state.rounds.once()
        withdrawn = [e for e in submitter.events(job=None) if e.kind == "offer_withdrawn"]
        assert [e.detail["offer_id"] for e in withdrawn] == ["b-d0"], withdrawn
        assert "stayed out of job" in withdrawn[0].detail["reason"]
        held = {lease.offer_id: lease for lease in submitter.job(job.job_id).leases}
        assert held["b-d0"].ends_at_s is not None and held["a-d0"].ends_at_s is None

        time.sleep(2)
        ledger.chain.advance_time(3)
        submitter.job_action(job.job_id, "cancel")
        (settled,) = [e for e in submitter.events(job=job.job_id) if e.kind == "job_settled"]
        assert settled.detail["unpaid_leases"] == [leases["b-d0"]]
        assert p2.address not in settled.detail["seconds"]
        assert ledger.lease(chain_job, p2.address).earned_wei == 0
        assert ledger.lease(chain_job, p1.address).verified_s == settled.detail["seconds"][
            p1.address] > 0
    finally:
        served.stop()
        coordinator.hosts.stop_all()



def proof_job_accepted(market, tmp_path):
    """Alice's proof job on a fresh chain job, leased to a and b, who accept on chain as
    their agents do, and both seated in the job's first epoch: (chain job, alice's
    client, the providers' clients, the job, lease by provider, worker by provider)."""
    served, ledger, (alice, _, p1, p2) = market
    chain_job = ledger.create_job(alice, 2 * PRICE, BUDGET).returned
    submitter = served.client(alice)
    providers, job = leased_and_hosted(served, submitter, (p1, p2), chain_job, PROOF_JOB)
    for name, client in providers.items():
        reply = client.heartbeat(name, Heartbeat())
        Agent(client, AgentConfig(agent_id=name, work_dir=tmp_path / name,
                                      chain=ChainPin.of(ledger)))._accept(
            reply.assignments)
    leases = {lease.offer_id[0]: lease.lease for lease in submitter.job(job.job_id).leases}
    workers = {name: f"{name}-l{leases[name]}-a0-w0" for name in "ab"}
    publish(served.app.state.coordinator, job.job_id, [workers["a"], workers["b"]], "start")
    return chain_job, submitter, providers, job, leases, workers


def test_a_provider_is_paid_only_the_share_of_its_work_records_it_filed(market, tmp_path):
    """Withholding: b's worker trains (it is in the job) but files no record of steps 3
    and 7, so those contributions cannot be audited. At settlement b is paid 8/10 of its
    metered time, a (every record filed) all of it, and the bill says why."""
    served, ledger, (alice, _, p1, p2) = market
    chain_job, submitter, providers, job, leases, workers = proof_job_accepted(market, tmp_path)
    for rank, name in enumerate("ab"):
        records = tuple(record(workers[name], step, rank=rank, shares=(4, 4))
                        for step in range(10) if name == "a" or step not in (3, 7))
        providers[name].upload_records(job.job_id, RecordUpload(lease=leases[name],
                                                                records=records))
    host_reached(served.app.state.coordinator, job.job_id, 9)  # the job got to step 9
    time.sleep(2)
    ledger.chain.advance_time(3)
    submitter.job_action(job.job_id, "cancel")
    (settled,) = [e for e in submitter.events(job=job.job_id) if e.kind == "job_settled"]
    assert settled.detail["records_withheld"] == {str(leases["b"]): {"owed": 10, "filed": 8}}
    metered = {p: int(w) for p, w in settled.detail["metered_wei"].items()}
    # Both leases ran the same seconds at the same price: b's bill is a's cut to 8/10.
    assert abs(metered[p2.address] - metered[p1.address] * 8 // 10) <= PRICE
    assert ledger.lease(chain_job, p2.address).earned_wei <= metered[p2.address]
    assert ledger.lease(chain_job, p1.address).earned_wei > ledger.lease(
        chain_job, p2.address).earned_wei
