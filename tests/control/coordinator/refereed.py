"""A coordinator with a referee that enforces on an embedded chain, and a job it
hosts leased to two staked providers whose agents accepted on chain: what the
tests of rulings through the coordinator start from."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shoal.control.agent import Agent, AgentConfig
from shoal.control.client import CoordinatorClient
from shoal.control.coordinator import Coordinator
from shoal.control.coordinator.settlement import Settlement
from shoal.control.trust.remote import RemoteAudits
from shoal.jobs.gpt_replay import gpt_replayer
from shoal.ledger import Chain, Ledger
from shoal.spec import hyper_digest
from shoal.spec.coordinator import Grant, Heartbeat, Role
from shoal.spec.ledger import LedgerConfig
from shoal.train.audit import Auditor
from shoal.train.proof_store import ProofStore
from tests.control.coordinator.conftest import Served, make_settings
from tests.control.coordinator.test_settlement import BUDGET, PRICE, leased_and_hosted


@dataclass
class Refereed:
    co: Coordinator
    served: Served
    ledger: Ledger
    chain_job: int
    job_id: str
    providers: dict[str, CoordinatorClient]  # "a", "b": each one agent, one offer, leased
    lease: dict[str, int]  # offer id ("a-d0", "b-d0") -> lease
    p1: object  # the providers' accounts (a's, b's) and the verifier's, granted its role
    p2: object
    vera: object


@contextlib.contextmanager
def refereed_job(tmp_path: Path, job_file: str) -> Iterator[Refereed]:
    chain = Chain.embedded()
    owner, operator, referee, alice, _, p1, p2, vera = chain.dev_accounts()[:8]
    ledger = Ledger.deploy(chain, owner, operator.address, referee.address,
                           LedgerConfig(min_stake_wei=10**15))
    for staker in (p1, p2):
        ledger.stake(staker, 10**18)
    ledger.stake(vera, 10**17)
    co = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db", operator),
                     settlement=Settlement(ledger, operator), referee_key=referee,
                     replayer=gpt_replayer)
    served = Served(co)
    try:
        submitter = served.client(alice)
        chain_job = ledger.create_job(alice, 2 * PRICE, BUDGET).returned
        providers, hosted = leased_and_hosted(served, submitter, (p1, p2), chain_job, job_file)
        for name, client in providers.items():  # their agents accept the leases on chain
            reply = client.heartbeat(name, Heartbeat())
            Agent(client, AgentConfig(agent_id=name, work_dir=tmp_path / name))._accept(
                reply.assignments)
        lease = {held.offer_id: held.lease for held in submitter.job(hosted.job_id).leases}
        served.client(operator).request("POST", "/v1/grants", Grant(
            address=vera.address, role=Role.verifier, name="vera"))
        yield Refereed(co, served, ledger, chain_job, hosted.job_id, providers, lease,
                       p1, p2, vera)
    finally:
        served.stop()
        co.hosts.stop_all()


def remote_verifier(served: Served, job_id: str, spec, vera, folder: Path,
                    answer_wait_s: float = 30.0) -> RemoteAudits:
    """Vera, auditing every record of the job through the coordinator into `folder`."""
    auditor = Auditor(ProofStore(folder), gpt_replayer(spec),
                      hyper_sha256=hyper_digest(spec.hyperparameters()),
                      tolerance=spec.proof.tolerance, verifier=vera.address)
    return RemoteAudits(served.client(vera), job_id, spec, auditor, vera, salt=b"v",
                        every=True, answer_wait_s=answer_wait_s, poll_s=0.1)
