"""The coordinator's composition root: who may do what, the market, and the store,
kept in step. No HTTP here: the API calls its services with the verified signer.

Every change is one transaction that writes the market's journal, the rows
the API reads, and an audit event together, so the store never shows a
lease the market would not rebuild after a restart (services/market_desk.py).
Services it builds and holds, each given what it uses: `desk` (the market, its
clock and its writer), `participants`, `reads`, `probing` (agents' network
probes), `offers` and `agents` (providers' offers, their agents and heartbeats),
`progress`, `planning` (the plan of each job's members), `attendance` (leases
held to the jobs' membership), `files` (who may send a large file before it is
read), `jobs` (jobs as their submitters drive them), `supervision` (the watch
over running work), `chain` (settlement on a chain) and `carry` (checkpoints
carried between machines). Its own: a market round (`clear`) and the nonces'
pruning. Still mixed in, until each becomes a service of its own: work records
and proof epochs (records.py), challenges and verdicts (challenges.py), bonded
challengers' disputes (disputes.py) and disputes nobody filed
(unfiled_disputes.py).
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
from shoal.coordinator.services.file_admission import FileAdmission
from shoal.coordinator.services.job_hosts import JobHosts
from shoal.coordinator.services.jobs import JobLifecycle
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.participants import Participants
from shoal.coordinator.services.planning import JobPlanning
from shoal.coordinator.services.probe import NetworkProbes, NetworkProbing
from shoal.coordinator.services.progress import JobProgress
from shoal.coordinator.services.providers import ProviderAgents, ProviderOffers
from shoal.coordinator.proofs.records import ProofService
from shoal.coordinator.services.reads import CoordinatorReads
from shoal.coordinator.settings import CoordinatorSettings
from shoal.coordinator.services.settlement import Settlement
from shoal.coordinator.services.supervision import JobSupervision
from shoal.coordinator.proofs.unfiled_disputes import UnfiledDisputes
from shoal.coordinator.db.database import open_store_engine
from shoal.coordinator.db.schema import JobRow, NonceRow
from shoal.coordinator.db.store import Store, record_event
from shoal.market import Clearing, MarketConfig
from shoal.spec.coordinator import COORDINATOR, ENDED, JobStatus
from shoal.spec.events import JobFilled, ProviderTermSpent
from shoal.spec.market import FillStatus


class Coordinator(ProofService, AuditService, DisputeService, UnfiledDisputes):
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
        self.offers = ProviderOffers(self.desk)
        self.hosts = JobHosts(settings.data_dir / "jobs", settings.rendezvous_address,
                              settings.stall_deadline_s)
        self._proof_init()
        self.progress = JobProgress(self.store, self.desk, self.job_spec,
                                    self._published.changes)
        self._audit_init()
        self.carry = CheckpointCarry(self.store, self.desk, settings, self.job_spec,
                                     self.work_records, self._published.all_members, replayer)
        self.planning = JobPlanning(self.store, self.desk, self.progress, self.job_spec)
        self.attendance = LeaseAttendance(self.store, self.desk, settings, self.hosts,
                                          self.progress, self.offers.bar_provider,
                                          self.offers.withdraw)
        self.referee = Referee(self, referee_key, replayer)
        self.chain = ChainSettlement(self.store, self.desk, settings, settlement,
                                     self.attendance, self.record_dues)
        self.jobs = JobLifecycle(self.desk, settings, self.participants, self.hosts, settlement,
                                 self.chain, self.close_proofs)
        self.supervision = JobSupervision(self.store, self.desk, settings, self.hosts,
                                          self.attendance, self.jobs.end, self.offers.withdraw,
                                          self.awaiting_records)
        self.agents = ProviderAgents(self.store, self.desk, settings, self.probing, self.hosts,
                                     self.pending_challenges, self.chain.acceptance_terms)
        self.files = FileAdmission(self.store, self.desk, settings, self.participants,
                                   self.carry.active_lease, self._answerable, self.plant_fetch)
        self._disputes_init()
        self._unfiled_init()

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
