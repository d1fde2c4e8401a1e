"""Attacks on how the coordinator uses the settlement contract (the embedded EVM):
one escrow backing two jobs, a fee the escrow cannot cover, a settlement that
fails once and is never tried again, an under-staked provider taken as accepted,
a submitter reclaiming the escrow of a job still running, and disputes opened on
chain and never brought to the referee, to freeze a provider's pay. Each ends with
the attacker no better off and the honest providers paid for what they did."""

from __future__ import annotations

import time

import pytest

from shoal.agent import Agent, AgentConfig, ChainPin
from shoal.client.http import CoordinatorRefused
from shoal.coordinator import Coordinator
from shoal.coordinator.services import chain_jobs
from shoal.coordinator.errors import Conflict
from shoal.coordinator.proofs.unfiled_disputes import UnfiledDisputes
from shoal.coordinator.services.settlement import Settlement
from shoal.ledger import Chain, ContractRevert, Ledger
from shoal.ledger.errors import ChainUnavailable
from shoal.spec.coordinator import Heartbeat, JobStatus, JobSubmission, OfferTerms, Registration
from shoal.spec.ledger import DisputeState, LedgerConfig
from tests.coordinator.conftest import TINY_JOB, Served, make_settings, provider_with_agent
from tests.coordinator.test_proofs import publish

PRICE = 1_000_000
BUDGET = 10**12
MIN_STAKE = 10**15


class Stage:
    """A coordinator settling on a fresh embedded chain; alice submits, p1 and p2 provide."""

    def __init__(self, tmp_path, settings: dict | None = None, referee: bool = False,
                 **config) -> None:
        """`referee`: the coordinator holds the contract's referee key."""
        self.chain = Chain.embedded()
        self.owner, operator, referee_key, self.alice, self.p1, self.p2, self.mallory = \
            self.chain.dev_accounts()[:7]
        self.ledger = Ledger.deploy(self.chain, self.owner, operator.address,
                                    referee_key.address,
                                    LedgerConfig(min_stake_wei=MIN_STAKE, **config))
        self.skipped_s = 0.0  # the coordinator's clock runs this far ahead of the wall's
        self.coordinator = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db",
                                                     **(settings or {})),
                                       clock=lambda: time.time() + self.skipped_s,
                                       settlement=Settlement(self.ledger, operator),
                                       referee_key=referee_key if referee else None)
        self.served = Served(self.coordinator)
        self.submitter = self.served.client(self.alice)
        self.submitter.register(Registration(role="submitter", name="alice"))
        self.tmp_path = tmp_path

    def stop(self) -> None:
        self.served.stop()
        self.coordinator.hosts.stop_all()

    def rounds(self) -> None:
        self.served.app.state.rounds.once()

    def submit(self, chain_job: int, budget: int = BUDGET) -> object:
        return self.submitter.submit(JobSubmission(
            name="tiny", job_file=TINY_JOB, workers=2, max_price_wei_per_s=2 * PRICE,
            budget_wei=budget, chain_job=chain_job))

    def providers(self, stakes=(10**18, 10**18)) -> dict:
        clients = {}
        for name, account, stake in zip("ab", (self.p1, self.p2), stakes):
            self.ledger.stake(account, stake)
            client = self.served.client(account)
            provider_with_agent(client, name)
            client.post_offer(OfferTerms(offer_id=f"{name}-d0", agent_id=name,
                                         price_wei_per_s=PRICE))
            clients[name] = client
        return clients

    def hosted(self, clients: dict, job) -> None:
        deadline = time.monotonic() + 60
        while not self.submitter.job(job.job_id).rendezvous:  # its job host starts serving
            assert time.monotonic() < deadline
            for name, client in clients.items():
                client.heartbeat(name, Heartbeat())
            self.rounds()
            time.sleep(0.2)

    def accept(self, clients: dict) -> None:
        """The agents' own code signs the offered terms, as at a beat."""
        for name, client in clients.items():
            Agent(client, AgentConfig(agent_id=name, work_dir=self.tmp_path / name,
                                      chain=ChainPin.of(self.ledger)))._accept(
                client.heartbeat(name, Heartbeat()).assignments)

    def working(self, clients: dict, chain_job: int, budget: int = BUDGET):
        """A job leased to a and b, both accepted on chain, both workers in the job."""
        job = self.submit(chain_job, budget)
        self.hosted(clients, job)
        self.accept(clients)
        leases = {lease.offer_id[0]: lease.lease for lease in self.submitter.job(job.job_id).leases}
        publish(self.coordinator, job.job_id, [f"{n}-l{leases[n]}-a0-w0" for n in "ab"], "start")
        return job

    def events(self, job_id: str, kind: str) -> list:
        return [e for e in self.submitter.events(job=job_id) if e.kind == kind]


@pytest.fixture
def stage(tmp_path):
    made = []

    def make(settings: dict | None = None, referee: bool = False, **config) -> Stage:
        made.append(Stage(tmp_path, settings, referee, **config))
        return made[-1]

    yield make
    for each in made:
        each.stop()


def test_one_chain_escrow_backs_one_job_once(stage):
    """alice escrows once and submits a second job on the same chain job, while the first
    runs and after it ended: settling either would refund the escrow the other spends."""
    s = stage()
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    first = s.submit(chain_job)
    with pytest.raises(CoordinatorRefused) as refused:
        s.submit(chain_job)
    assert refused.value.status == 409 and "create a new chain job" in refused.value.detail
    s.submitter.job_action(first.job_id, "cancel")
    with pytest.raises(CoordinatorRefused) as refused:  # ended: its escrow is spent or refunded
        s.submit(chain_job)
    assert refused.value.status == 409
    assert [job.job_id for job in s.submitter.jobs()] == [first.job_id]


def test_the_escrow_must_cover_the_market_fee_on_top_of_the_budget(stage):
    """With a 2 % fee, `book` needs pay plus fee in escrow: a job escrowed at exactly its
    budget would spend it all and book nothing, and its submitter would reclaim it all."""
    s = stage(fee_bps=200)
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    with pytest.raises(CoordinatorRefused, match="fund it first") as refused:
        s.submit(chain_job)
    assert refused.value.status == 409
    s.ledger.fund(s.alice, chain_job, BUDGET * 2 // 100)
    job = s.submit(chain_job)
    with pytest.raises(CoordinatorRefused, match="fund it first"):  # the fee on a top-up too
        s.submitter.top_up(job.job_id, 100)
    s.ledger.fund(s.alice, chain_job, 100)
    with pytest.raises(CoordinatorRefused, match="fund it first"):
        s.submitter.top_up(job.job_id, 100)
    s.ledger.fund(s.alice, chain_job, 2)
    assert s.submitter.top_up(job.job_id, 100).budget_wei == BUDGET + 100


def test_a_job_that_spends_its_whole_budget_is_booked_with_the_fee(stage):
    """The honest story of the fee attack: the job runs until its budget is gone (the market
    pauses it), and every provider is booked and the fee reserved, not refunded."""
    s = stage({"agent_timeout_s": 600.0}, fee_bps=200)  # no agent is lost over the skip
    budget = 2 * 100 * PRICE  # 100 s of both devices
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, s.coordinator.settlement.escrow_needed(
        budget)).returned
    clients = s.providers()
    job = s.working(clients, chain_job, budget)
    s.skipped_s = 100.0  # the job runs its budget out (requests signed now would be refused)
    s.rounds()
    assert s.submitter.job(job.job_id).status is JobStatus.paused  # for want of escrow
    s.chain.advance_time(110)
    s.coordinator.jobs.end(s.alice.address, job.job_id, JobStatus.cancelled)
    (settled,) = s.events(job.job_id, "job_settled")
    escrow = s.ledger.job(chain_job)
    assert escrow.settled_at
    assert escrow.owed_wei == sum(int(w) for w in settled.detail["wei"].values())
    for account in (s.p1, s.p2):
        assert s.ledger.lease(chain_job, account.address).verified_s >= 90
    assert escrow.fee_wei == escrow.owed_wei * 2 // 100


def test_a_failed_settlement_is_retried_until_the_chain_shows_it_settled(stage, monkeypatch):
    """The one-shot settlement loses its receipt after booking (the chain did book): the
    coordinator tries again, books nothing twice, and settles; alice's later reclaim finds
    nothing to take back, and each provider is paid what was booked once."""
    s = stage()
    monkeypatch.setattr(chain_jobs, "SETTLE_RETRY_S", 0.0, raising=False)
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    clients = s.providers()
    job = s.working(clients, chain_job)
    real_book = s.ledger.book

    def book_then_lose_the_receipt(*args, **kwargs):
        real_book(*args, **kwargs)
        monkeypatch.setattr(s.ledger, "book", real_book)
        raise ChainUnavailable("the receipt never came")

    monkeypatch.setattr(s.ledger, "book", book_then_lose_the_receipt)
    time.sleep(2)
    s.chain.advance_time(3)
    s.submitter.job_action(job.job_id, "cancel")
    assert s.events(job.job_id, "settlement_failed") and not s.ledger.job(chain_job).settled_at
    booked = {a.address: s.ledger.lease(chain_job, a.address).verified_s for a in (s.p1, s.p2)}
    assert all(booked.values())

    s.rounds()
    (settled,) = s.events(job.job_id, "job_settled")
    assert s.ledger.job(chain_job).settled_at
    for account in (s.p1, s.p2):  # booked once, to what the store metered (the chain's clock
        lease = s.ledger.lease(chain_job, account.address)  # ran on: maybe more than at first)
        assert booked[account.address] <= lease.verified_s == settled.detail["seconds"][
            account.address] <= int(settled.detail["metered_wei"][account.address]) // PRICE
    s.chain.advance_time(10**6)
    with pytest.raises(ContractRevert, match="already settled"):
        s.ledger.reclaim(s.alice, chain_job)
    s.rounds()  # settled: never tried again
    assert len(s.events(job.job_id, "settlement_failed")) == 1


def test_an_under_staked_provider_is_refused_not_taken_as_accepted(stage):
    """b's free stake cannot lock its lease's collateral: the chain would open the lease
    only offered, and b would work for nothing. Its acceptance is refused, offered again,
    and taken once b has staked enough."""
    s = stage()
    budget = 10 * MIN_STAKE  # the collateral of each lease: its whole budget
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, budget).returned
    clients = s.providers(stakes=(10**18, MIN_STAKE))
    job = s.submit(chain_job, budget)
    s.hosted(clients, job)
    (offered,) = clients["b"].heartbeat("b", Heartbeat()).assignments
    agent_b = Agent(clients["b"], AgentConfig(agent_id="b", work_dir=s.tmp_path / "b",
                                                  chain=ChainPin.of(s.ledger)))
    agent_b._accept((offered,))
    assert agent_b.accepted == set()  # refused: offered again at the next beat
    assert not s.ledger.lease(chain_job, s.p2.address).unpaid  # nothing opened on chain
    with pytest.raises(CoordinatorRefused) as refused:
        clients["b"].accept_lease(offered.lease.lease, s.ledger.sign_acceptance(
            s.p2, chain_job, PRICE, offered.acceptance.term_s, offered.acceptance.deadline))
    assert refused.value.status == 409 and "stake at least" in refused.value.detail
    assert s.events(job.job_id, "chain_lease_accepted") == []

    s.ledger.stake(s.p2, budget)
    (again,) = clients["b"].heartbeat("b", Heartbeat()).assignments
    assert again.acceptance is not None
    agent_b._accept((again,))
    assert agent_b.accepted == {again.lease.lease}
    assert s.ledger.lease(chain_job, s.p2.address).accepted_at > 0


def test_a_lease_opened_only_offered_is_refused_until_its_provider_accepts_on_chain(stage):
    """b's stake fell between the coordinator's check and the open (here: the lease is opened
    offered behind its back): the coordinator does not take it as accepted; once b accepts
    on chain itself, its lease is taken at the chain's acceptance time."""
    s = stage()
    budget = 10 * MIN_STAKE
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, budget).returned
    clients = s.providers(stakes=(10**18, MIN_STAKE))
    job = s.submit(chain_job, budget)
    s.hosted(clients, job)
    (offered,) = clients["b"].heartbeat("b", Heartbeat()).assignments
    terms = offered.acceptance
    signed = s.ledger.sign_acceptance(s.p2, chain_job, PRICE, terms.term_s, terms.deadline)
    s.ledger.open_accepted_leases(s.coordinator.settlement.operator, chain_job, [signed])
    with pytest.raises(CoordinatorRefused) as refused:
        clients["b"].accept_lease(offered.lease.lease, signed)
    assert refused.value.status == 409 and "only offered" in refused.value.detail
    assert s.events(job.job_id, "chain_lease_accepted") == []
    s.ledger.stake(s.p2, budget)
    s.ledger.accept(s.p2, chain_job)
    clients["b"].accept_lease(offered.lease.lease, signed)
    (accepted,) = s.events(job.job_id, "chain_lease_accepted")
    assert accepted.detail["accepted_at"] == s.ledger.lease(chain_job, s.p2.address).accepted_at


def test_the_submitter_cannot_reclaim_the_escrow_of_a_running_job(stage):
    """Work is booked at the job's end: alice waits out the operator's silence timeout
    mid-job and reclaims. The coordinator keeps the chain job active, so the reclaim fails
    and the providers are paid at the end."""
    s = stage(silence_timeout_s=100)
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    clients = s.providers()
    job = s.working(clients, chain_job)
    for _ in range(6):  # 180 s of chain time, a round every 30 s
        s.chain.advance_time(30)
        s.rounds()
        with pytest.raises(ContractRevert, match="not yet silent"):
            s.ledger.reclaim(s.alice, chain_job)
    s.submitter.job_action(job.job_id, "cancel")
    (settled,) = s.events(job.job_id, "job_settled")
    for account in (s.p1, s.p2):
        assert s.ledger.lease(chain_job, account.address).verified_s == settled.detail[
            "seconds"][account.address] > 0


def test_a_job_whose_chain_job_was_reclaimed_ends(stage):
    """The coordinator was down past the silence timeout and alice reclaimed: its next
    round ends the job, so no provider works on for an escrow that is gone."""
    s = stage(silence_timeout_s=100)
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    clients = s.providers()
    job = s.working(clients, chain_job)
    s.chain.advance_time(101)
    s.ledger.reclaim(s.alice, chain_job)
    s.rounds()
    ended = s.submitter.job(job.job_id)
    assert ended.status is JobStatus.failed
    assert all(lease.ends_at_s is not None for lease in ended.leases)
    assert s.events(job.job_id, "chain_job_closed") and not s.events(job.job_id,
                                                                    "settlement_failed")


def test_disputes_opened_and_never_brought_to_the_referee_are_rejected_unheard(stage):
    """Mallory opens every dispute the contract allows on p1's lease and files none: each
    froze p1's pay until the contract's dispute timeout (days) for gas, its bond back
    then, and kept any honest challenger off the lease. Past the coordinator's grace its
    referee rejects them unheard: the bonds go to the treasury, the lease is free, and a
    late filing is refused. A dispute still inside the grace, or on a chain job this
    coordinator does not run, is left alone; one opened while the coordinator was down
    gets its whole grace once it is back."""
    grace_s = 600
    s = stage(settings={"unfiled_dispute_grace_s": grace_s}, referee=True)
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    job = s.working(s.providers(), chain_job)
    bond = s.ledger.config().min_bond_wei
    opened = []
    while True:  # as many as the contract lets one lease have open (the last slot is the referee's)
        try:
            opened.append(s.ledger.open_dispute(s.mallory, chain_job, s.p1.address,
                                                bond).returned)
        except ContractRevert as refused:
            assert "too many open disputes" in str(refused)
            break
    assert len(opened) == 7
    treasury = s.ledger.credit_of(s.owner.address)
    s.chain.advance_time(grace_s // 2)
    s.rounds()
    assert all(s.ledger.dispute(d).state is DisputeState.open for d in opened)
    s.chain.advance_time(grace_s // 2 + 1)
    s.rounds()
    assert [s.ledger.dispute(d).state for d in opened] == [DisputeState.rejected] * 7
    assert s.ledger.credit_of(s.owner.address) == treasury + 7 * bond
    assert s.ledger.credit_of(s.mallory.address) == 0
    assert not s.ledger.lease(chain_job, s.p1.address).disputed
    dismissed = s.events(job.job_id, "dispute_dismissed")
    assert sorted(e.detail["dispute"] for e in dismissed) == opened
    # The lease takes an honest challenger's dispute again, which waits its own grace.
    honest = s.ledger.open_dispute(s.p2, chain_job, s.p1.address, bond).returned
    s.rounds()
    assert s.ledger.dispute(honest).state is DisputeState.open
    # A filing past the grace is refused before anything is read of it.
    with pytest.raises(Conflict, match="rejects it unheard"):
        s.coordinator.unfiled.check_filing_in_time(s.ledger.dispute(opened[0]))
    # A chain job this coordinator does not run is not its to judge.
    elsewhere = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    s.ledger.open_lease(s.coordinator.settlement.operator, elsewhere, s.p1.address, PRICE, 3600)
    s.ledger.accept(s.p1, elsewhere)
    foreign = s.ledger.open_dispute(s.mallory, elsewhere, s.p1.address, bond).returned
    s.chain.advance_time(grace_s + 1)
    s.rounds()
    assert s.ledger.dispute(foreign).state is DisputeState.open
    assert s.ledger.dispute(honest).state is DisputeState.rejected  # filed by nobody either
    # One opened while the coordinator was down (nobody could file it) has its whole grace
    # once it is back, for a filing as for the referee.
    while_down = s.ledger.open_dispute(s.p2, chain_job, s.p1.address, bond).returned
    s.chain.advance_time(grace_s + 1)
    co = s.coordinator  # a starting coordinator remembers nothing of disputes
    co.unfiled = UnfiledDisputes(co.store, co.desk, co.settings, co.settlement, co.penalties)
    s.rounds()
    s.coordinator.unfiled.check_filing_in_time(s.ledger.dispute(while_down))  # not refused
    assert s.ledger.dispute(while_down).state is DisputeState.open
    s.chain.advance_time(grace_s + 1)
    s.rounds()
    assert s.ledger.dispute(while_down).state is DisputeState.rejected


def test_a_job_that_settles_on_chain_takes_one_device_per_provider(stage):
    """The contract holds one lease per job and provider, booked for at most the time
    since it was accepted: a provider's second device in the job would work unpaid. So
    the auction leases it no second device there, and says why."""
    s = stage()
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    clients = {}
    for name, account in zip("ab", (s.p1, s.p2)):
        s.ledger.stake(account, 10**18)
        clients[name] = s.served.client(account)
        provider_with_agent(clients[name], name, devices=2 if name == "a" else 1)
    for device in (0, 1):  # a's two devices, the cheapest on the market
        clients["a"].post_offer(OfferTerms(offer_id=f"a-d{device}", agent_id="a",
                                           device=device, price_wei_per_s=PRICE // 2))
    clients["b"].post_offer(OfferTerms(offer_id="b-d0", agent_id="b", price_wei_per_s=PRICE))
    job = s.submitter.submit(JobSubmission(
        name="tiny", job_file=TINY_JOB, workers=3, min_workers=2,
        max_price_wei_per_s=2 * PRICE, budget_wei=BUDGET, chain_job=chain_job))
    s.rounds()
    view = s.submitter.job(job.job_id)
    assert sorted(lease.offer_id for lease in view.leases) == ["a-d0", "b-d0"]
    (filled,) = s.events(job.job_id, "job_filled")
    assert filled.detail["status"] == "partial"
    assert "max_devices_per_provider" in filled.detail["reason"]


def test_a_job_topped_up_past_its_chain_leases_terms_stops_each_provider_where_they_end(stage):
    """Each provider signed a chain lease that books at most its term at its price (the
    budget then: 200 s each). Alice tops the job up to three times that and lets it run
    on: each provider's lease stops where it billed its term, and the job takes no more of
    it, instead of it working on for pay the chain cannot book. What was metered is what
    the chain books."""
    s = stage({"agent_timeout_s": 600.0})  # no agent is lost over the skip
    budget = 2 * 100 * PRICE  # 100 s of both devices
    settlement = s.coordinator.settlement
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, settlement.escrow_needed(budget)).returned
    job = s.working(s.providers(), chain_job, budget)
    accepted = s.events(job.job_id, "chain_lease_accepted")
    assert {e.detail["bookable_wei"] for e in accepted} == {str(200 * PRICE)}  # term 200 s
    s.ledger.fund(s.alice, chain_job, settlement.escrow_needed(4 * 100 * PRICE))
    s.submitter.top_up(job.job_id, 4 * 100 * PRICE)
    s.skipped_s = 250.0  # the job runs on (requests signed now would be refused)
    s.rounds()
    spent = s.events(job.job_id, "provider_term_spent")
    assert {e.detail["provider"] for e in spent} == {s.p1.address, s.p2.address}
    meter = s.coordinator.desk.market.meter(job.job_id)
    for lease in meter.leases:
        assert lease.ends_at_s is not None and lease.ends_at_s - lease.start_s <= 200.0
    assert sum(meter.charges(s.coordinator.desk.now_s()).values()) <= 2 * 200 * PRICE
    s.chain.advance_time(260)
    s.coordinator.jobs.end(s.alice.address, job.job_id, JobStatus.cancelled)
    (settled,) = s.events(job.job_id, "job_settled")
    for account in (s.p1, s.p2):
        booked = s.ledger.lease(chain_job, account.address).verified_s
        assert 199 <= booked == settled.detail["seconds"][account.address] <= 200
        assert int(settled.detail["metered_wei"][account.address]) == booked * PRICE


def test_a_job_paused_for_good_is_settled_and_frees_its_providers_stake(stage):
    """Alice pauses her job and leaves it so: the coordinator kept its chain job active
    for as long as it ran, and the providers' collateral stayed locked until settlement.
    A job that holds no device is now kept no longer than the contract's silence timeout:
    then it is ended and settled, and after the dispute window its providers are paid and
    their stake is free."""
    s = stage({"agent_timeout_s": 600.0}, silence_timeout_s=100)
    chain_job = s.ledger.create_job(s.alice, 2 * PRICE, BUDGET).returned
    job = s.working(s.providers(), chain_job)
    assert s.ledger.stake_of(s.p1.address).locked_wei > 0
    s.submitter.job_action(job.job_id, "pause")
    s.skipped_s = 60.0  # idle, within the timeout: kept, and kept active
    s.rounds()
    assert s.submitter.job(job.job_id).status is JobStatus.paused
    s.skipped_s = 160.0
    s.rounds()
    (ended,) = s.events(job.job_id, "job_cancelled")
    assert "held no device" in ended.detail["reason"]
    assert s.ledger.job(chain_job).settled_at
    s.chain.advance_time(s.ledger.config().dispute_window_s + 1)
    s.ledger.payout(s.alice, chain_job, [s.p1.address, s.p2.address])
    for account in (s.p1, s.p2):
        assert s.ledger.stake_of(account.address).locked_wei == 0
        assert s.ledger.credit_of(account.address) > 0  # paid for the time it worked
