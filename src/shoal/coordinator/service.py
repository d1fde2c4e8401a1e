"""The coordinator's composition root: who may do what, the market, and the store,
kept in step. No HTTP here: the API calls its services with the verified signer.

Every change is one transaction that writes the market's journal, the rows
the API reads, and an audit event together, so the store never shows a
lease the market would not rebuild after a restart (services/market_desk.py).
It builds each service it holds with what that service uses, in an order in
which nothing is used before it is built:

- the door: `quotas` (how many requests a key and an address may send);
- the market: `desk` (the market, its clock and its writer), `participants`,
  `offers` and `agents` (providers' offers, their agents and heartbeats),
  `probing` (agents' network probes), `reads`;
- the jobs: `specs` (each job's spec), `bundles` (the submitters' own code, for
  jobs that run it), `jobs` (as their submitters drive them),
  `progress`, `planning` (the plan of each job's members), `attendance` (leases
  held to the jobs' membership), `supervision` (the watch over running work),
  `files` (who may send a large file before it is read), `carry` (checkpoints
  carried between machines), `chain` (settlement on a chain);
- proof of learning (proofs/): `records` (work records and proof epochs),
  `plants` (forced errors), `challenges` with their answers' `retention`,
  `verdicts`, `referee` with its `penalties`, `disputes` and `unfiled` (disputes
  nobody brought here).

Its own: a market round (`clear`) and the nonces' pruning.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from eth_account.signers.local import LocalAccount
from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session

from shoal.coordinator.db.database import open_store_engine
from shoal.coordinator.db.schema import JobRow, NonceRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.proofs.challenges import Challenges
from shoal.coordinator.proofs.disputes import Disputes
from shoal.coordinator.proofs.keeper_routing import Keepers
from shoal.coordinator.proofs.open_challenges import OpenChallenges
from shoal.coordinator.proofs.penalties import Penalties
from shoal.coordinator.proofs.plants import Plants
from shoal.coordinator.proofs.records import ProofRecords
from shoal.coordinator.proofs.referee import Referee
from shoal.coordinator.proofs.retention import AnswerRetention
from shoal.coordinator.proofs.unfiled_disputes import UnfiledDisputes
from shoal.coordinator.proofs.verdict_stake import VerdictStake
from shoal.coordinator.proofs.verdicts import Verdicts
from shoal.coordinator.services import journal
from shoal.coordinator.services.attendance import LeaseAttendance
from shoal.coordinator.services.bundles import JobBundles, JobSecrets
from shoal.coordinator.services.chain_jobs import ChainSettlement
from shoal.coordinator.services.checkpoints import CheckpointCarry
from shoal.coordinator.services.file_admission import FileAdmission
from shoal.coordinator.services.job_hosts import JobHosts
from shoal.coordinator.services.job_specs import JobSpecs
from shoal.coordinator.services.jobs import JobLifecycle
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.participants import Participants
from shoal.coordinator.services.planning import JobPlanning
from shoal.coordinator.services.probe import NetworkProbes, NetworkProbing
from shoal.coordinator.services.progress import JobProgress
from shoal.coordinator.services.providers import ProviderAgents, ProviderOffers
from shoal.coordinator.services.quotas import RequestQuotas
from shoal.coordinator.services.reads import CoordinatorReads
from shoal.coordinator.services.settlement import Settlement
from shoal.coordinator.services.supervision import JobSupervision
from shoal.coordinator.settings import CoordinatorSettings
from shoal.market import Clearing, MarketConfig
from shoal.spec.coordinator import COORDINATOR, ENDED, JobStatus
from shoal.spec.events import JobFilled, ProviderTermSpent
from shoal.spec.job import JobSpec
from shoal.spec.market import FillStatus, JobFill

if TYPE_CHECKING:
    from shoal.verify.replay import Replayer


class Coordinator:
    """One coordinator's state: a market rebuilt from its journal, the store, and the
    services that change them."""

    def __init__(self, settings: CoordinatorSettings, engine: Engine | None = None,
                 clock: Callable[[], float] = time.time,
                 settlement: Settlement | None = None, referee_key: LocalAccount | None = None,
                 replayer: Callable[[JobSpec], Replayer] | None = None) -> None:
        """`settlement` None: escrow is the store's bookkeeping only. `referee_key`: the
        contract's referee account; the coordinator then slashes through the contract on
        the guilty verdicts its replay upholds. `replayer`: builds a job's replayer, for
        those rulings (and to check a keeper's answer)."""
        self.settings = settings
        self.settlement = settlement
        self.engine = engine or open_store_engine(settings.store_url)
        self.store = store = Store(self.engine)
        self.quotas = RequestQuotas(settings.key_quota, settings.address_quota)
        self.desk = desk = MarketDesk(store, settings.price_table(),
                                      MarketConfig(notice_period_s=settings.notice_period_s), clock)
        # The market.
        self.participants = Participants(store, settings, desk.now_s, desk.change)
        self.probes = NetworkProbes(settings.rendezvous_address, settings.probe_deadline_s,
                                    desk.now_s)
        self.probing = NetworkProbing(store, settings, self.probes)
        self.reads = CoordinatorReads(store, desk, settings)
        self.offers = ProviderOffers(desk)
        self.hosts = JobHosts(settings.data_dir / "jobs", settings.rendezvous_address,
                              settings.stall_deadline_s)
        # The jobs' specs and records, which most of what follows reads.
        self.specs = specs = JobSpecs(store)
        self.records = records = ProofRecords(store, desk, settings, specs, self.hosts,
                                              settlement)
        self.progress = JobProgress(store, desk, specs.job_spec, records.published.changes)
        self.carry = CheckpointCarry(store, desk, settings, specs.job_spec, records.work_records,
                                     records.published.all_members, replayer)
        self.planning = JobPlanning(store, desk, self.progress, specs.job_spec)
        self.attendance = LeaseAttendance(store, desk, settings, self.hosts, self.progress,
                                          self.offers.bar_provider, self.offers.withdraw)
        # Proof of learning: the plants, challenges and verdicts, the referee and disputes.
        self.penalties = Penalties(store, desk, settlement, self.offers, referee_key)
        open_challenges = OpenChallenges()
        self.plants = plants = Plants(store, desk, settings, specs, records, open_challenges,
                                      self.penalties)
        keepers = Keepers(store, desk, settings, specs, records.published, open_challenges,
                          replayer)
        self.challenges = Challenges(store, desk, settings, specs, records, plants, keepers,
                                     open_challenges)
        self.retention = AnswerRetention(desk, specs, settings.answer_retention_s,
                                         lambda: plants.forced_errors_on,
                                         self.challenges.answer_path)
        self.referee = Referee(store, specs, records, plants, self.penalties, replayer)
        self.verdicts = Verdicts(store, desk, specs, records, plants, self.referee,
                                 VerdictStake(settlement))
        self.unfiled = UnfiledDisputes(store, desk, settings, settlement, self.penalties)
        self.disputes = Disputes(store, desk, settlement, records, plants, self.challenges,
                                 self.referee, self.unfiled, self.offers)
        # The jobs' lifecycle, their supervision and settlement.
        self.chain = ChainSettlement(store, desk, settings, settlement, self.attendance,
                                     records.record_dues)
        self.bundles = JobBundles(store, settings, specs.job_spec, self.carry.active_lease)
        self.secrets = JobSecrets(settings)
        self.jobs = JobLifecycle(desk, settings, self.participants, self.hosts, settlement,
                                 self.chain, records.close_proofs, self.bundles.check_job,
                                 self.secrets)
        self.supervision = JobSupervision(store, desk, settings, self.hosts, self.attendance,
                                          self.jobs.end, self.offers.withdraw,
                                          records.awaiting_records,
                                          lambda job: specs.job_spec(job).steps)
        self.agents = ProviderAgents(store, desk, settings, self.probing, self.hosts,
                                     self.challenges.pending, self.chain.acceptance_terms,
                                     self.secrets.of)
        self.files = FileAdmission(store, desk, settings, self.participants,
                                   self.carry.active_lease, self.challenges.answerable,
                                   plants.plant_fetch)

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

    def _note_fill(self, session: Session, now: float, fill: JobFill) -> None:
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
