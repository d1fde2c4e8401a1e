"""The coordinator's composition root: who may do what, the market, and the store,
kept in step. No HTTP here: the API calls these methods with the verified signer.

Every change is one transaction that writes the market's journal, the rows
the API reads, and an audit event together, so the store never shows a
lease the market would not rebuild after a restart (services/market_desk.py).
Services it builds and holds: `desk` (the market, its clock and its writer),
`participants`, `reads`, `probing` (agents' network probes), `progress`,
`planning` (the plan of each job's members), `attendance` (leases held to the
jobs' membership) and `files` (who may send a large file before it is read).
Still mixed in, until each becomes a service of its own: jobs as submitters
drive them (jobs.py), the watch over running work (supervision.py), settlement
on a chain (chain_jobs.py), work records and proof epochs (records.py),
challenges and verdicts (challenges.py), bonded challengers' disputes
(disputes.py) and checkpoints carried between machines (checkpoints.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session

from shoal.coordinator.services import journal
from shoal.coordinator.services.attendance import LeaseAttendance
from shoal.coordinator.proofs.challenges import AuditService
from shoal.coordinator.services.chain_jobs import ChainSettlement
from shoal.coordinator.services.checkpoints import CheckpointCarry
from shoal.coordinator.proofs.disputes import DisputeService
from shoal.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.coordinator.services.file_admission import FileAdmission
from shoal.coordinator.services.job_hosts import JobHosts
from shoal.coordinator.services.jobs import JobLifecycle
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.participants import Participants
from shoal.coordinator.services.planning import JobPlanning
from shoal.coordinator.services.probe import NetworkProbes, NetworkProbing
from shoal.coordinator.services.progress import JobProgress
from shoal.coordinator.proofs.records import ProofService
from shoal.coordinator.services.reads import CoordinatorReads
from shoal.coordinator.settings import CoordinatorSettings
from shoal.coordinator.services.settlement import Settlement
from shoal.coordinator.services.supervision import JobSupervision
from shoal.coordinator.proofs.unfiled_disputes import UnfiledDisputes
from shoal.coordinator.services.views import agent_view, offer_view
from shoal.coordinator.db import beats
from shoal.coordinator.db.database import open_store_engine
from shoal.coordinator.db.schema import AgentRow, JobRow, NonceRow, OfferRow
from shoal.coordinator.db.store import Store, record_event
from shoal.market import Clearing, MarketConfig
from shoal.spec.coordinator import (
    COORDINATOR, ENDED, AgentRegistration, AgentView, Assignment, Heartbeat, HeartbeatReply,
    JobStatus, OfferTerms, OfferView,
)
from shoal.spec.events import (
    AgentRegistered, JobFilled, OfferPosted, OfferWithdrawn, ProviderBarred, ProviderTermSpent,
)
from shoal.spec.market import DeviceLease, FillStatus, Offer


class Coordinator(JobLifecycle, JobSupervision,
                  ChainSettlement, ProofService, AuditService, DisputeService, UnfiledDisputes,
                  CheckpointCarry):
    """One coordinator's state: a market rebuilt from its journal, and the store."""

    def __init__(self, settings: CoordinatorSettings, engine: Engine | None = None,
                 clock: Callable[[], float] = time.time,
                 settlement: Settlement | None = None, referee_key: Any = None,
                 replayer: Any = None) -> None:
        """`referee_key`: the contract's referee account; the coordinator then slashes
        through the contract on the guilty verdicts its replay upholds. `replayer`: builds
        a job's replayer (JobSpec -> Replayer), for those rulings."""
        from shoal.coordinator.proofs.referee import Referee

        self.settings = settings
        self.settlement = settlement  # None: escrow is the store's bookkeeping only
        self.engine = engine or open_store_engine(settings.store_url)
        self.store = Store(self.engine)
        self.desk = MarketDesk(self.store, settings.price_table(),
                               MarketConfig(notice_period_s=settings.notice_period_s), clock)
        self.participants = Participants(self.store, settings, self.desk.now_s, self.desk.change)
        self.probes = NetworkProbes(settings.rendezvous_address, settings.probe_deadline_s,
                                    self.desk.now_s)
        self.probing = NetworkProbing(self.store, settings, self.probes)
        self.reads = CoordinatorReads(self.store, self.desk, settings)
        self._speeds_seen: dict[str, int] = {}  # job -> mtime of the speeds last judged
        self.hosts = JobHosts(settings.data_dir / "jobs", settings.rendezvous_address,
                              settings.stall_deadline_s)
        self._proof_init()
        self.progress = JobProgress(self.store, self.desk, self.job_spec,
                                    self._published.changes)
        self._audit_init()
        self._carry_init()
        self.planning = JobPlanning(self.store, self.desk, self.progress, self.job_spec)
        self.attendance = LeaseAttendance(self.store, self.desk, settings, self.hosts,
                                          self.progress, self.bar_provider,
                                          self.withdraw_offer)
        self.referee = Referee(self, referee_key, replayer)
        self.files = FileAdmission(self.store, self.desk, settings, self.participants,
                                   self._active_lease, self._answerable, self.plant_fetch)
        self._disputes_init()
        self._unfiled_init()
        self.started_s = self.desk.now_s()

    # ------------------------------------------------------------ providers
    def register_agent(self, provider: str, registration: AgentRegistration) -> AgentView:
        bad = [d.device_kind for d in registration.devices if not d.collective_ok]
        if bad:
            raise Conflict(f"agent '{registration.agent_id}': the pre-flight collective failed "
                           f"on {bad}; fix the backend before offering these devices")
        # The link as our probe saw it, not as the agent states it.
        measured = self.probing.probed_devices(provider, registration)
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = session.get(AgentRow, registration.agent_id)
            if row is not None and row.provider != provider:
                raise Forbidden(f"agent '{registration.agent_id}' belongs to another provider")
            devices = [d.model_dump(mode="json") for d in measured]
            if row is None:
                row = AgentRow(agent_id=registration.agent_id, provider=provider,
                               registered_at_s=now, running=[], region=registration.region,
                               devices=devices, last_seen_s=now)
                session.add(row)
            row.region, row.devices, row.last_seen_s = registration.region, devices, now
            record_event(session, now, provider, AgentRegistered(
                agent_id=row.agent_id, region=row.region, devices=devices))
            return agent_view(row, now, self.settings.agent_timeout_s)

    def post_offer(self, provider: str, terms: OfferTerms) -> OfferView:
        with self.desk.change() as session:
            now = self.desk.now_s()
            agent = self._own_agent(session, provider, terms.agent_id)
            if terms.device >= len(agent.devices):
                raise NotFound(f"agent '{agent.agent_id}' measured {len(agent.devices)} "
                               f"device(s); there is no device {terms.device}")
            measured = agent.devices[terms.device]
            row = session.get(OfferRow, terms.offer_id)
            if row is not None and row.provider != provider:
                raise Forbidden(f"offer '{terms.offer_id}' belongs to another provider")
            speed = measured["speed_samples_per_s"]
            if row is not None and row.marked_down:
                speed = min(speed, row.speed_samples_per_s)  # a re-post does not undo a mark-down
            offer = Offer(offer_id=terms.offer_id, provider=provider,
                          device_kind=measured["device_kind"], speed_samples_per_s=speed,
                          memory_gb=measured["memory_gb"], region=agent.region,
                          price_wei_per_s=terms.price_wei_per_s, tenancy=terms.tenancy)
            reference = self.desk.command(session, journal.PostOffer(offer=offer), now)
            if row is None:
                row = OfferRow(offer_id=offer.offer_id, provider=provider, marked_down=False)
                session.add(row)
            row.agent_id, row.device, row.device_kind = agent.agent_id, terms.device, offer.device_kind
            row.region, row.speed_samples_per_s, row.memory_gb = offer.region, speed, offer.memory_gb
            row.price_wei_per_s, row.tenancy = offer.price_wei_per_s, offer.tenancy.value
            row.reference_wei_per_s, row.withdrawn = reference, False
            record_event(session, now, provider, OfferPosted(
                offer_id=offer.offer_id, price_wei_per_s=offer.price_wei_per_s,
                tenancy=offer.tenancy.value))
            return offer_view(row)

    def bar_provider(self, job_id: str, provider: str, reason: str) -> None:
        """Lease none of `provider`'s devices to `job_id` again (removed from it: its worker
        stayed out, or it was slashed); a re-posted offer would otherwise win it back."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            self.desk.command(session, journal.BarProvider(job=job_id, provider=provider), now)
            record_event(session, now, COORDINATOR,
                         ProviderBarred(provider=provider, reason=reason), job_id)

    def withdraw_offer(self, actor: str, offer_id: str, reason: str = "withdrawn") -> OfferView:
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = session.get(OfferRow, offer_id)
            if row is None:
                raise NotFound(f"no offer '{offer_id}'")
            if actor not in (row.provider, COORDINATOR):
                raise Forbidden(f"offer '{offer_id}' belongs to another provider")
            if not row.withdrawn:
                ended = self.desk.command(
                    session, journal.WithdrawOffer(offer_id=offer_id, provider=row.provider), now)
                self.desk.store_leases(session, ended)
                row.withdrawn = True
                record_event(session, now, actor, OfferWithdrawn(
                    offer_id=offer_id, reason=reason,
                    ended_leases=[lease.lease for lease in ended]))
            return offer_view(row)

    def heartbeat(self, provider: str, agent_id: str, beat: Heartbeat,
                  taken: beats.BeatTaken | None = None) -> HeartbeatReply:
        """Note the agent alive; answer with the workers it must run and those to stop.

        No market call and no lock: a beat touches one agent's row, so a
        thousand agents beating cannot queue behind a clearing round. Beats
        are group-committed (`store.beats`): this returns once the beat's
        transaction has committed. The API's signed beats come `taken`
        already, in one transaction with their nonce and role check.
        """
        if taken is None:
            taken = beats.beat_committer(self.engine).submit(beats.BeatNote(
                provider, agent_id, sorted(set(beat.running)), self.desk.now_s())).result()
        if taken.outcome is beats.BeatOutcome.no_agent:
            raise NotFound(f"no agent '{agent_id}': register it (POST /v1/agents) first")
        if taken.outcome is beats.BeatOutcome.not_owner:
            raise Forbidden(f"agent '{agent_id}' belongs to another provider")
        now = taken.at_s
        current = [(DeviceLease.model_validate(value), job_file, rendezvous)
                   for value, job_file, rendezvous in taken.leases]
        open_numbers = {lease.lease for lease, _, _ in current if lease.start_s <= now}
        terms = self._acceptance_terms(provider, [lease for lease, _, _ in current])
        return HeartbeatReply(
            at_s=now,
            # A worker is assigned once its job's host serves: it has a rendezvous to join.
            assignments=tuple(Assignment(lease=lease, job_file=job_file, rendezvous=rendezvous,
                                         rendezvous_pass=self.hosts.gate_pass(lease.job,
                                                                              lease.lease),
                                         ends_at_s=lease.ends_at_s,
                                         acceptance=terms.get(lease.lease))
                              for lease, job_file, rendezvous in current
                              if lease.lease in open_numbers and rendezvous),
            stop=tuple(n for n in beat.running if n not in open_numbers),
            challenges=self.pending_challenges(agent_id))

    def _own_agent(self, session: Session, provider: str, agent_id: str) -> AgentRow:
        agent = session.get(AgentRow, agent_id)
        if agent is None:
            raise NotFound(f"no agent '{agent_id}': register it (POST /v1/agents) first")
        if agent.provider != provider:
            raise Forbidden(f"agent '{agent_id}' belongs to another provider")
        return agent

    # ------------------------------------------------------------ the market's rounds
    def clear(self) -> Clearing:
        """One market round; journaled and stored only when it changed something."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            clearing = self.desk.market.clear(now)
            if not journal.changed(clearing, self.desk.fill_status):
                return clearing
            self.desk.record(session, journal.Clear(), now)
            self.desk.store_leases(session, clearing.stopped)
            for job_id, provider in clearing.spent:
                record_event(session, now, COORDINATOR, ProviderTermSpent(
                    provider=provider, reason="its leases of the job billed all its "
                    "chain lease can book: they stop, and it takes no more of the job"), job_id)
            for fill in clearing.fills:
                self.desk.store_leases(session, fill.new_leases)
                self.desk.store_leases(session, [n.lease for n in fill.notices])
                self._note_fill(session, now, fill)
            self.desk.fill_status.update({f.job: f.status.value for f in clearing.fills})
            return clearing

    def _note_fill(self, session: Session, now: float, fill: Any) -> None:
        row = session.get(JobRow, fill.job)
        if row is None or JobStatus(row.status) in ENDED:
            return
        status = {FillStatus.full: JobStatus.running, FillStatus.partial: JobStatus.running,
                  FillStatus.unfilled: JobStatus.waiting,
                  FillStatus.paused: JobStatus.paused}[fill.status]
        if status.value != row.status or fill.new_leases or fill.notices:
            row.status = status.value
            record_event(session, now, COORDINATOR, JobFilled(
                status=fill.status, held=fill.held, reason=fill.reason,
                new_leases=[lease.lease for lease in fill.new_leases],
                notices=[n.lease.lease for n in fill.notices]), fill.job)

    def prune_nonces(self) -> int:
        """Forget nonces older than two skew windows: their requests are refused as stale."""
        horizon = self.desk.now_s() - 2 * self.settings.max_skew_s
        with self.store.change() as session:
            return session.execute(delete(NonceRow).where(NonceRow.seen_at_s < horizon)).rowcount
