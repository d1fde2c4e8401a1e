"""The provider agent: registers its measured devices, offers them, beats to
the coordinator, and runs a worker for each lease it is assigned.

Through a coordinator outage it keeps its workers running and keeps trying:
a lease ends only when the coordinator says so (or the agent stops).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.agent.bundled import BundledLeases
from shoal.agent.checkpoints import CheckpointRelay
from shoal.agent.environments import Environments
from shoal.agent.leases import LeaseWorkers
from shoal.agent.preflight import memory_gb, preflight
from shoal.agent.progress import ProgressRelay
from shoal.agent.sandbox import Limits, sandbox_problem
from shoal.agent.proofs import ProofRelay
from shoal.client.http import CoordinatorClient, CoordinatorRefused
from shoal.errors import ControlError
from shoal.ledger.acceptance import sign_acceptance
from shoal.spec.coordinator import (
    AcceptanceTerms, AgentRegistration, Assignment, Heartbeat, OfferTerms, Registration,
)
from shoal.spec.market import Tenancy

if TYPE_CHECKING:  # the chain client loads only where a ledger is handed in
    from shoal.ledger import Ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChainPin:
    """The chain and contract this agent's provider staked on, from its own configuration:
    lease terms naming any other are not signed, whoever sends them (a coordinator gone
    bad, or anyone rewriting its replies on the way)."""

    chain_id: int
    contract: str

    @classmethod
    def of(cls, ledger: Ledger) -> ChainPin:
        """The chain and contract of a ledger client the provider holds itself."""
        return cls(ledger.chain.chain_id, ledger.address)

    def refusal(self, terms: AcceptanceTerms) -> str | None:
        if terms.chain_id != self.chain_id:
            return f"chain id {terms.chain_id}, not this agent's {self.chain_id}"
        if terms.contract.lower() != self.contract.lower():
            return f"contract {terms.contract}, not this agent's {self.contract}"
        return None


@dataclass(frozen=True)
class AgentConfig:
    agent_id: str
    work_dir: Path
    devices: int = 1
    device_kind: str = "cpu"
    region: str = "local"
    price_wei_per_s: int = 1_000_000
    tenancy: Tenancy = Tenancy.spot
    slowdown: float = 1.0  # pose as a device this many times slower (demos, tests)
    grace_s: float = 20.0  # a leaving worker's time to hand over before it is killed
    adversary: str | None = None  # workers cheat this way (rehearsing the verifiers)
    chain: ChainPin | None = None  # None: sign no chain lease (off-chain jobs only)
    bundled_jobs: bool = True  # run submitters' own code, sandboxed (where this host can)
    pip_args: tuple[str, ...] = ()  # for pip, building bundled jobs' environments
    job_disk_bytes: int = 20 << 30  # the disk one bundled lease may fill

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ControlError("--devices must be at least 1")
        if self.slowdown < 1.0:
            raise ControlError("--slowdown must be at least 1 (1: this machine's own speed)")


def _bundled_leases(client: CoordinatorClient, config: AgentConfig) -> BundledLeases | None:
    """What runs bundled jobs here, or None (said) where this agent will not."""
    if not config.bundled_jobs:
        return None
    problem = sandbox_problem()
    if problem is not None:
        log.warning("bundled jobs (submitters' own code) are refused here: %s", problem)
        return None
    # Each lease's job gets its device's share of this machine: the CPU time and memory
    # the pre-flight measured per device, and its own disk.
    share = Limits(cpus=(os.cpu_count() or 1) / config.devices,
                   memory_bytes=int(memory_gb(config.devices) * 2**30),
                   disk_bytes=config.job_disk_bytes)
    return BundledLeases(client.another_connection(), config.work_dir,
                         Environments(config.work_dir / "environments", config.pip_args), share)


class Agent:
    def __init__(self, client: CoordinatorClient, config: AgentConfig) -> None:
        self.client, self.config = client, config
        self.workers = LeaseWorkers(config.agent_id, config.work_dir, config.slowdown,
                                    config.grace_s, adversary=config.adversary,
                                    bundled=_bundled_leases(client, config))
        # Uploads run on a thread and a connection of their own: a beat held up behind
        # them would get the agent reaped and its leases replaced. Challenge answers run
        # on a third: behind a checkpoint carry (the coordinator verifies it before it
        # replies) or a backlog of records, an answer waited past verifiers' patience.
        relay_client = client.another_connection()
        answer_client = client.another_connection()
        self.proofs = ProofRelay(relay_client, config.work_dir, config.agent_id, answer_client)
        self.progress = ProgressRelay(relay_client, config.work_dir)
        self.carry = CheckpointRelay(relay_client, config.work_dir)
        self._relay_lock = threading.Lock()
        self._period_s = 1.0  # the coordinator's heartbeat period, read when run() starts
        self._challenges: tuple = ()
        self._beat_at_s: float | None = None  # the coordinator's time of the newest reply
        self._relay = threading.Thread(target=self._relay_loop, name="agent-relay", daemon=True)
        self._answerer = threading.Thread(target=self._answer_loop, name="agent-answers",
                                          daemon=True)
        self._new_beat = threading.Event()  # a beat brought challenges: answer them now
        self.stopping = threading.Event()
        self.offer_ids = [f"{config.agent_id}-d{i}" for i in range(config.devices)]
        self.accepted: set[int] = set()  # leases whose chain terms were signed
        self.unsigned: set[int] = set()  # leases whose chain terms it refused to sign

    def enroll(self) -> None:
        """Register as a provider, pre-flight (the coordinator's probe is a provider's
        call), register the agent with what it measured, post its offers."""
        c = self.config
        try:
            self.client.register(Registration(role="provider", name=c.agent_id))
        except CoordinatorRefused as refused:
            if refused.status != 409:
                raise
        measured = preflight(self.client, c.agent_id, c.devices, c.device_kind, c.slowdown)
        first = measured[0]
        log.info("pre-flight: %d × %s at %.1f samples/s, %.1f GB, collective with the "
                 "coordinator %s", c.devices, c.device_kind, first.speed_samples_per_s,
                 first.memory_gb, f"ok ({first.rtt_ms:.2f} ms, {first.bandwidth_gbps:.2f} Gb/s)"
                 if first.collective_ok else "FAILED")
        self.client.register_agent(AgentRegistration(agent_id=c.agent_id, region=c.region,
                                                     devices=measured))
        self.post_offers()

    def post_offers(self) -> None:
        for index, offer_id in enumerate(self.offer_ids):
            self.client.post_offer(OfferTerms(offer_id=offer_id, agent_id=self.config.agent_id,
                                              device=index, tenancy=self.config.tenancy,
                                              price_wei_per_s=self.config.price_wei_per_s))

    def run(self) -> None:
        """Beat until stopped; then the workers leave and the offers are withdrawn."""
        period_s = self._period_s = self.client.info().heartbeat_s
        offline_since: float | None = None
        self._relay.start()
        self._answerer.start()
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                reply = self.client.heartbeat(self.config.agent_id,
                                              Heartbeat(running=self.workers.running()))
                if offline_since is not None:
                    log.info("coordinator back after %.1f s", time.monotonic() - offline_since)
                    offline_since = None
                    self._repost_if_withdrawn()
                self._accept(reply.assignments)
                self.workers.follow(reply.assignments, reply.stop)
                with self._relay_lock:
                    self._challenges, self._beat_at_s = reply.challenges, reply.at_s
                self._new_beat.set()
            except ControlError as error:
                if offline_since is None:
                    offline_since = time.monotonic()
                    log.warning("heartbeat failed (%s); workers keep running, retrying", error)
            self.stopping.wait(max(0.0, period_s - (time.monotonic() - started)))
        self._leave()

    def _accept(self, assignments: tuple[Assignment, ...]) -> None:
        """Sign the chain lease terms the coordinator offers (EIP-712; no transaction).

        Only the terms are signed, never a blank: the price is the lease's own,
        and the contract binds the signature to its chain, itself and the job.
        """
        for assignment in assignments:
            terms, number = assignment.acceptance, assignment.lease.lease
            if terms is None or number in self.accepted or number in self.unsigned:
                continue
            if self.config.chain is None:
                refusal = ("this agent was started without --chain-id and --contract, so it "
                           "has nothing of its own to hold the terms to")
            elif terms.price_wei_per_s != assignment.lease.price_wei_per_s:
                refusal = (f"chain terms at {terms.price_wei_per_s} wei/s, not the lease's "
                           f"{assignment.lease.price_wei_per_s}")
            else:
                refusal = self.config.chain.refusal(terms)
            if refusal is not None:
                # Said once: the terms come back at every beat, and the lease goes unpaid
                # (the coordinator ends it unaccepted) rather than signed blind.
                log.error("lease %d: not signing its chain terms: %s", number, refusal)
                self.unsigned.add(number)
                continue
            signed = sign_acceptance(self.client.account, terms.chain_id, terms.contract,
                                     terms.chain_job, terms.price_wei_per_s, terms.term_s,
                                     terms.deadline)
            try:
                self.client.accept_lease(number, signed)
                log.info("lease %d: accepted chain lease on job %d at %d wei/s", number,
                         terms.chain_job, terms.price_wei_per_s)
            except CoordinatorRefused as refused:
                if "already accepted" not in refused.detail:
                    # e.g. too little stake yet: offered again at the next beat
                    log.warning("lease %d: acceptance refused: %s", number, refused.detail)
                    continue
            self.accepted.add(number)

    def _repost_if_withdrawn(self) -> None:
        """Offers withdrawn while the coordinator could not hear us are posted again."""
        mine = {o.offer_id: o for p in self.client.providers() for o in p.offers
                if o.offer_id in self.offer_ids}
        if any(o.withdrawn for o in mine.values()):
            log.info("offers were withdrawn while we were unheard; posting them again")
            self.post_offers()

    def _relay_loop(self) -> None:
        """Send new work records and step progress and carry checkpoints, once a beat."""
        while not self.stopping.wait(self._period_s):
            self._relay_once()

    def _relay_once(self) -> None:
        workers = dict(self.workers.workers)
        try:
            self.proofs.upload({w.job for w in workers.values()})
            self.progress.upload({n: w.job for n, w in workers.items()})
        except ControlError as error:
            log.warning("sending work records failed (%s); trying again", error)
        # After the records: a checkpoint is checked against its step's records.
        self.carry.sync({n: (w.job, self.workers.job_file(n)) for n, w in workers.items()},
                        live={n for n, w in workers.items()
                              if w.process.alive() and not w.leaving})

    def _answer_loop(self) -> None:
        """Answer the challenges of each beat as it comes (and at least once a period)."""
        while not self.stopping.is_set():
            self._new_beat.wait(self._period_s)
            self._new_beat.clear()
            if not self.stopping.is_set():
                self._answer_once()

    def _answer_once(self) -> None:
        with self._relay_lock:
            challenges, beat_at_s = self._challenges, self._beat_at_s
        try:
            if self.proofs.answer(challenges) and beat_at_s is not None:
                # Every challenge taken up to that beat is answered: the files of windows
                # closed well before it may go (ended jobs' too).
                self.proofs.prune(beat_at_s)
        except ControlError as error:
            log.warning("answering challenges failed (%s); trying again", error)

    def _leave(self) -> None:
        self.workers.stop_all()
        self._new_beat.set()  # the answerer sees `stopping` at once
        for thread in (self._relay, self._answerer):
            if thread.is_alive():
                thread.join(timeout=30)
        self._relay_once()  # what the workers wrote as they left: their last records and steps
        self._answer_once()
        for offer_id in self.offer_ids:
            try:
                self.client.withdraw_offer(offer_id)
            except ControlError as error:
                log.warning("could not withdraw offer %s: %s", offer_id, error)
