"""A lost agent's workers are reported exited to the job's host by the
coordinator that reaps the agent: with its machine, the agent's launcher is
gone too, and no one else would tell the membership authority (a paused
job's last state holder would then hold the job forever)."""

from __future__ import annotations

import time

from eth_account import Account
from sqlalchemy.orm import Session

from shoal.control.serve import RendezvousServer
from shoal.control.store.schema import AgentRow, JobRow
from shoal.spec.coordinator import Heartbeat, JobSubmission, OfferTerms, Registration
from tests.control.coordinator.conftest import TINY_JOB, provider_with_agent
from tests.control.coordinator.test_proofs import publish

PRICE = 1_000_000


def test_a_lost_agents_workers_are_reported_exited_to_the_jobs_host(served):
    co = served.app.state.coordinator
    clients = {}
    for agent in ("a", "b"):
        clients[agent] = served.client(Account.create())
        provider_with_agent(clients[agent], agent)
        clients[agent].post_offer(OfferTerms(offer_id=f"{agent}-d0", agent_id=agent,
                                             price_wei_per_s=PRICE))
    alice = served.client(Account.create())
    alice.register(Registration(role="submitter", name="alice"))
    job = alice.submit(JobSubmission(name="tiny", job_file=TINY_JOB, workers=2,
                                     max_price_wei_per_s=2 * PRICE, budget_wei=10**12))
    served.app.state.rounds.once()
    leases = {lease.offer_id: lease.lease for lease in alice.job(job.job_id).leases}
    host = RendezvousServer("127.0.0.1")  # stands in for the job's host
    try:
        with Session(co.engine) as session, session.begin():
            session.get(JobRow, job.job_id).rendezvous = f"127.0.0.1:{host.port}"
        workers = {a: f"{a}-l{leases[f'{a}-d0']}-a0-w0" for a in ("a", "b")}
        publish(co, job.job_id, list(workers.values()), "start")
        assert host.rdzv.exited(list(workers.values())) == []

        clients["b"].heartbeat("b", Heartbeat())
        with Session(co.engine) as session, session.begin():  # a fell silent long ago
            session.get(AgentRow, "a").last_seen_s = time.time() - 3600
        co.started_s -= 60  # long up: losses count (not just back from a restart)
        assert co.reap_lost_agents() == ["a"]
        assert host.rdzv.exited(list(workers.values())) == [workers["a"]]  # b's is not
        (lost,) = [e for e in alice.events(job=job.job_id) if e.kind == "workers_lost"]
        assert lost.detail["workers"] == [workers["a"]]
    finally:
        host.close()
