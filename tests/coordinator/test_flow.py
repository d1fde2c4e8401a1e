"""The coordinator end to end over HTTP on both stores: offers, a job, a lease
with the device it holds, the agent told to run it, escrow and its pause, a
lost agent replaced, and everything rebuilt after a restart."""

from __future__ import annotations

import time

from eth_account import Account

from shoal.coordinator import Coordinator
from shoal.spec.coordinator import Heartbeat, JobStatus, JobSubmission, OfferTerms, Registration
from tests.coordinator.conftest import TINY_JOB, Served, make_settings, provider_with_agent

PRICE = 1_000_000  # wei per second, under the cpu reference


def submit(client, workers=1, budget=10**12, max_price=2 * PRICE, name="tiny", **terms):
    client.register(Registration(role="submitter", name="alice"))
    return client.submit(JobSubmission(name=name, job_file=TINY_JOB, workers=workers,
                                       max_price_wei_per_s=max_price, budget_wei=budget, **terms))


def offer(client, agent_id="agent-a", offer_id="dev-a", price=PRICE, **terms):
    provider_with_agent(client, agent_id)
    return client.post_offer(OfferTerms(offer_id=offer_id, agent_id=agent_id,
                                        price_wei_per_s=price, **terms))


def until(read, ok, served, beat=(), timeout_s=60.0):
    """Run market rounds until `ok(read())`; the agents in `beat` stay alive meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for client, agent_id in beat:
            client.heartbeat(agent_id, Heartbeat())
        served.app.state.rounds.once()
        value = read()
        if ok(value):
            return value
        time.sleep(0.2)
    raise AssertionError(f"not reached in {timeout_s} s: {value}")


def beat_for(client, seconds, agent_id="agent-a"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        client.heartbeat(agent_id, Heartbeat())
        time.sleep(0.1)


def test_a_job_is_leased_the_device_and_its_agent_told_to_run_it(served: Served):
    provider, submitter = served.client(Account.create()), served.client(Account.create())
    posted = offer(provider)
    assert posted.speed_samples_per_s == 100.0  # the agent's measured figure, not a claim
    job = submit(submitter)
    assert job.status is JobStatus.waiting and job.leases == ()

    served.app.state.rounds.once()
    job = submitter.job(job.job_id)
    assert job.status is JobStatus.running
    (lease,) = job.leases
    assert (lease.offer_id, lease.provider, lease.device_kind) == ("dev-a", provider.account.address, "cpu")
    assert lease.price_wei_per_s == PRICE  # paid its asked price, not the ceiling

    assert provider.heartbeat("agent-a", Heartbeat()).assignments == ()  # no rendezvous yet
    job = until(lambda: submitter.job(job.job_id), lambda j: j.rendezvous, served,
                beat=[(provider, "agent-a")])
    reply = provider.heartbeat("agent-a", Heartbeat())
    (assignment,) = reply.assignments
    assert assignment.lease.lease == lease.lease and assignment.job_file == TINY_JOB
    assert assignment.rendezvous == job.rendezvous

    cancelled = submitter.job_action(job.job_id, "cancel")
    assert cancelled.status is JobStatus.cancelled
    assert all(lease.ends_at_s is not None for lease in cancelled.leases)  # no idle billing
    reply = provider.heartbeat("agent-a", Heartbeat(running=(lease.lease,)))
    assert reply.assignments == () and reply.stop == (lease.lease,)
    kinds = [e.kind for e in submitter.events(job=job.job_id)]
    assert kinds == ["job_submitted", "job_filled", "job_host_started", "job_rendezvous",
                     "job_cancelled"]


def test_a_job_out_of_escrow_pauses_and_resumes_when_topped_up(served: Served):
    provider, submitter = served.client(Account.create()), served.client(Account.create())
    offer(provider)
    job = submit(submitter, budget=2 * PRICE)  # two seconds of one device
    served.app.state.rounds.once()
    assert submitter.job(job.job_id).status is JobStatus.running
    beat_for(provider, 2.2)  # the agent stays alive while the escrow runs out
    served.app.state.rounds.once()
    paused = submitter.job(job.job_id)
    assert paused.status is JobStatus.paused
    assert paused.spent_wei <= paused.budget_wei  # never billed past the escrow
    assert all(lease.ends_at_s is not None for lease in paused.leases)

    submitter.top_up(job.job_id, 100 * PRICE)
    served.app.state.rounds.once()
    resumed = submitter.job(job.job_id)
    assert resumed.status is JobStatus.running
    assert len([lease for lease in resumed.leases if lease.ends_at_s is None]) == 1


def test_a_lost_agent_is_replaced_from_the_market(served: Served):
    first, second = served.client(Account.create()), served.client(Account.create())
    submitter = served.client(Account.create())
    offer(first, "agent-a", "dev-a", price=PRICE)
    offer(second, "agent-b", "dev-b", price=PRICE + 1)  # dearer: leased only as the replacement
    job = submit(submitter)
    served.app.state.rounds.once()
    assert [lease.offer_id for lease in submitter.job(job.job_id).leases] == ["dev-a"]

    deadline = time.monotonic() + 5  # agent-a goes silent; agent-b keeps beating
    while time.monotonic() < deadline:
        second.heartbeat("agent-b", Heartbeat())
        served.app.state.rounds.once()
        leases = submitter.job(job.job_id).leases
        if any(lease.offer_id == "dev-b" for lease in leases):
            break
        time.sleep(0.2)
    leases = {lease.offer_id: lease for lease in submitter.job(job.job_id).leases}
    assert leases["dev-a"].ends_at_s is not None and leases["dev-b"].ends_at_s is None
    lost = [e for e in submitter.events() if e.kind == "offer_withdrawn"]
    assert lost and lost[0].detail["reason"] == "agent lost"


def test_a_restarted_coordinator_rebuilds_the_same_market(store_url, operator):
    coordinator = Coordinator(make_settings(store_url, operator))
    served = Served(coordinator)
    provider, submitter = served.client(Account.create()), served.client(Account.create())
    offer(provider, "agent-a", "dev-a")
    offer(provider, "agent-b", "dev-b")
    job = submit(submitter, workers=2)
    served.app.state.rounds.once()
    submitter.top_up(job.job_id, 12345)
    before = submitter.job(job.job_id)
    served.stop()
    coordinator.engine.dispose()

    again = Coordinator(make_settings(store_url, operator))
    meter = again.desk.market.meter(job.job_id)
    assert meter.leases == before.leases and meter.budget_wei == before.budget_wei
    again.clear()  # a round after the restart leases nothing twice
    assert again.desk.market.meter(job.job_id).leases == before.leases
    assert again.reads.job(job.job_id).status is JobStatus.running
    coordinator.hosts.stop_all()
    again.engine.dispose()


def test_a_spot_only_bid_is_never_filled_with_on_demand(served: Served):
    provider, submitter = served.client(Account.create()), served.client(Account.create())
    offer(provider, tenancy="on_demand")
    job = submit(submitter, tenancies=frozenset({"spot"}))
    served.app.state.rounds.once()
    assert submitter.job(job.job_id).leases == ()


def test_an_offer_slower_than_its_claim_is_marked_down(served: Served):
    import json

    coordinator = served.app.state.coordinator
    submitter = served.client(Account.create())
    claims = {"honest-1": 100.0, "honest-2": 100.0, "inflated": 400.0}  # the liar claims 4×
    providers = {}
    for name, speed in claims.items():
        provider = providers[name] = served.client(Account.create())
        provider_with_agent(provider, name, speed=speed)
        provider.post_offer(OfferTerms(offer_id=name, agent_id=name, price_wei_per_s=PRICE))
    job = submit(submitter, workers=3)
    served.app.state.rounds.once()
    leases = {lease.offer_id: lease.lease for lease in submitter.job(job.job_id).leases}
    # What the job host writes: each worker's measured job speed; all three run alike.
    run_dir = coordinator.hosts.run_dir(job.job_id)
    run_dir.mkdir(parents=True, exist_ok=True)  # the round started its job host
    shown = {"honest-1": 30.0, "honest-2": 31.0, "inflated": 30.5}
    (run_dir / "speeds.json").write_text(json.dumps({"epoch": 0, "speeds": {
        f"{name}-l{leases[name]}-a0-w0": speed for name, speed in shown.items()}}))
    coordinator.supervision.hold_offers_to_speeds(job.job_id)

    views = {o["offer_id"]: o for o in served.client().request("GET", "/v1/offers", sign=False)}
    assert views["inflated"]["marked_down"] and not views["honest-1"]["marked_down"]
    assert views["inflated"]["speed_samples_per_s"] < 110.0  # what it showed, not 400
    market = coordinator.desk.market
    assert market.book.offer("inflated").speed_samples_per_s < 110.0  # the auction too
    coordinator.supervision.hold_offers_to_speeds(job.job_id)  # judged once: no second mark
    marks = [e for e in submitter.events() if e.kind == "offer_marked_down"]
    assert [e.detail["offer_id"] for e in marks] == ["inflated"]
    # The liar re-posts its offer (and re-registers its agent's inflated figures): no gain.
    provider_with_agent(providers["inflated"], "inflated", speed=400.0)
    reposted = providers["inflated"].post_offer(
        OfferTerms(offer_id="inflated", agent_id="inflated", price_wei_per_s=PRICE))
    assert reposted.marked_down and reposted.speed_samples_per_s < 110.0
    assert coordinator.desk.market.book.offer("inflated").speed_samples_per_s < 110.0


def test_metrics_count_what_happened(served: Served):
    import httpx

    provider, submitter = served.client(Account.create()), served.client(Account.create())
    offer(provider)
    submit(submitter)
    provider.heartbeat("agent-a", Heartbeat())
    served.app.state.rounds.once()
    httpx.post(f"{served.url}/v1/jobs", content=b"{}")  # unsigned: refused, and counted
    text = httpx.get(f"{served.url}/metrics").text
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line and not line.startswith("#")}
    assert samples['shoal_jobs{status="running"}'] == 1
    assert samples["shoal_agents_online"] == 1 and samples["shoal_workers_leased"] == 1
    assert samples["shoal_agent_heartbeats_total"] >= 1
    assert samples["shoal_leases_opened_total"] == 1
    assert samples['shoal_requests_refused_total{reason="unauthenticated"}'] == 1


def test_a_job_file_cannot_reach_into_a_providers_files(served: Served, tmp_path):
    from shoal.agent.leases import LeaseWorkers
    from shoal.client.http import CoordinatorRefused
    from shoal.spec.coordinator import Assignment
    from shoal.spec.market import DeviceLease

    prying = TINY_JOB.replace('corpus = "stdlib"', 'corpus = "/root/.ssh"')
    submitter = served.client(Account.create())
    submitter.register(Registration(role="submitter", name="mallory"))
    try:
        submitter.submit(JobSubmission(name="pry", job_file=prying, workers=1,
                                       max_price_wei_per_s=PRICE, budget_wei=PRICE))
        raise AssertionError("the coordinator took a job that reads a provider's files")
    except CoordinatorRefused as refused:
        assert refused.status == 422 and "corpus" in refused.detail
    # An agent does not trust its coordinator with its disk either.
    lease = DeviceLease(lease=1, job="pry", offer_id="o", provider="0x" + "1" * 40,
                        device_kind="cpu", region="eu", speed_samples_per_s=1.0, memory_gb=1.0,
                        tenancy="spot", priority=0, price_wei_per_s=1, start_s=0.0)
    workers = LeaseWorkers("agent", tmp_path)
    workers.follow((Assignment(lease=lease, job_file=prying, rendezvous="127.0.0.1:1",
                               ends_at_s=None),), ())
    assert workers.running() == () and workers.refused == {1}


def test_a_job_file_cannot_ask_the_coordinator_to_build_a_giant(served: Served):
    """Issue 40, point 10: the coordinator builds a job's model (to check carried
    checkpoints, to plant forced errors) and takes its parameters as challenge files.
    Before: a job file of 64 layers of width 8192 (51.6 billion parameters, 192 GiB in
    float32) was taken, and the first checkpoint check built it. Now it is refused at
    submission, saying why and what to change; a model whose parameters fit one file is
    taken."""
    from shoal.client.http import CoordinatorRefused

    giant = TINY_JOB.replace("layers = 1", "layers = 64").replace("width = 32", "width = 8192")
    giant = giant.replace("context = 32", "context = 8192")
    submitter = served.client(Account.create())
    submitter.register(Registration(role="submitter", name="mallory"))
    try:
        submitter.submit(JobSubmission(name="giant", job_file=giant, workers=1,
                                       max_price_wei_per_s=PRICE, budget_wei=PRICE))
        raise AssertionError("the coordinator took a job of 51 billion parameters")
    except CoordinatorRefused as refused:
        assert refused.status == 422 and "51,6" in refused.detail and "[model]" in refused.detail
    assert submitter.submit(JobSubmission(name="tiny", job_file=TINY_JOB, workers=1,
                                          max_price_wei_per_s=PRICE, budget_wei=PRICE)).job_id
