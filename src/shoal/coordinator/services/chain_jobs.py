"""The coordinator's side of settlement on a chain, a service it holds:
a job is taken only against its own escrow there (one chain job backs one
job), providers accept their chain leases by signature, a live job's chain
job is kept from looking abandoned (one that holds no device, no longer than
the contract's silence timeout), and a job's end books and settles what the
store metered, retried until the chain shows it settled
(shoal.coordinator.services.settlement talks to the contract)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.errors import Conflict, Forbidden
from shoal.coordinator.services import journal
from shoal.coordinator.db.schema import ChainLeaseRow, JobRow, LeaseRow, SettlementRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.services.attendance import LeaseAttendance
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.settlement import Settlement
from shoal.coordinator.settings import CoordinatorSettings
from shoal.ledger import LedgerError
from shoal.market import charge_wei
from shoal.proof.dues import Dues
from shoal.spec.coordinator import COORDINATOR, ENDED, JobStatus, JobSubmission
from shoal.spec.events import ChainJobClosed, ChainLeaseAccepted, JobSettled, SettlementFailed
from shoal.spec.ledger import LeaseAcceptance
from shoal.spec.market import DeviceLease

log = logging.getLogger(__name__)
SETTLE_RETRY_S = 30.0  # wait after a failed settlement before the first retry; doubles each time
SETTLE_RETRY_MAX_S = 3600.0
KEEP_ACTIVE_PER_SILENCE = 4  # a live job's chain job is touched this often per silence timeout

# The proof services' count, per lease, of the work records its workers owed and filed
# (job, finished).
RecordDues = Callable[[str, bool], dict[int, Dues]]
# The job lifecycle's end of a job: (actor, job, status, **detail). It settles the job
# here, so it is handed to `tend` rather than held: neither service holds the other both ways.
EndJob = Callable[..., object]


class ChainSettlement:
    """A job's escrow and its providers' leases on chain, and its settlement there."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 settlement: Settlement | None, attendance: LeaseAttendance,
                 record_dues: RecordDues) -> None:
        """`settlement` None: escrow is the store's bookkeeping only. `attendance`: a lease
        whose worker never joined the job books nothing; `record_dues` (the proof
        services'): a lease is paid the share of its owed work records it filed."""
        self.store, self.desk, self.settings = store, desk, settings
        self.settlement, self.attendance, self.record_dues = settlement, attendance, record_dues

    def check_escrow(self, submitter: str, submission: JobSubmission) -> None:
        """Refuse a submission whose escrow this coordinator cannot hold it to: a chain
        job where none settles, none where one does, or one its escrow does not cover."""
        if self.settlement is None:
            if submission.chain_job is not None:
                raise Conflict("this coordinator does not settle on a chain; drop chain_job")
            return
        if submission.chain_job is None:
            raise Conflict("this coordinator settles on a chain: create a job on the contract "
                           f"{self.settlement.contract} with its escrow, and give its chain_job")
        self.settlement.check_escrow(submission.chain_job, submitter, submission.budget_wei,
                                     submission.max_price_wei_per_s)

    def refuse_used_chain_job(self, session: Session, chain_job: int | None) -> None:
        """A chain job's escrow backs one coordinator job, once: settling either of two
        jobs on it would refund the escrow while the other's providers work on unpaid."""
        if chain_job is None:
            return
        used = session.scalars(select(JobRow.job_id).where(JobRow.chain_job == chain_job)).first()
        if used is not None:
            raise Conflict(f"chain job {chain_job} already backs job '{used}', and a chain job "
                           "backs one job only: create a new chain job with the contract's "
                           "create_job, fund it, and submit with its id")

    def acceptance_terms(self, provider: str, leases: list[DeviceLease]) -> dict[int, Any]:
        """Terms to sign for leases whose (job, provider) has no chain lease yet."""
        if self.settlement is None or not leases:
            return {}
        with self.store.read() as session:
            jobs = {row.job_id: row for row in session.scalars(
                select(JobRow).where(JobRow.job_id.in_({lease.job for lease in leases}),
                                     JobRow.chain_job.is_not(None)))}
            accepted = set(session.scalars(select(ChainLeaseRow.job_id).where(
                ChainLeaseRow.provider == provider, ChainLeaseRow.job_id.in_(set(jobs)))))
        pending = [lease for lease in leases if lease.job in jobs and lease.job not in accepted]
        if not pending:
            return {}
        deadline = self.settlement.deadline()  # one read of the chain's clock per beat
        return {lease.lease: self.settlement.terms(jobs[lease.job].chain_job,
                                                   lease.price_wei_per_s,
                                                   int(jobs[lease.job].bid["budget_wei"]), deadline)
                for lease in pending}

    def accept_lease(self, provider: str, lease_number: int, acceptance: LeaseAcceptance) -> None:
        """Open the provider's chain lease for the job this device lease belongs to."""
        if self.settlement is None:
            raise Conflict("this coordinator does not settle on a chain")
        with self.desk.change() as session:
            lease = session.get(LeaseRow, lease_number)
            if lease is None or lease.provider != provider or acceptance.provider != provider:
                raise Forbidden(f"lease {lease_number} is not yours to accept")
            job = session.get(JobRow, lease.job_id)
            if job.chain_job is None:
                raise Conflict(f"job {job.job_id} does not settle on chain")
            if session.get(ChainLeaseRow, (job.job_id, provider)) is not None:
                raise Conflict(f"your lease on job {job.job_id} is already accepted on chain")
            terms = self.settlement.terms(job.chain_job, lease.price_wei_per_s,
                                          int(job.bid["budget_wei"]), acceptance.deadline)
            accepted_at = self.settlement.open_lease(acceptance, terms)  # Conflict if not locked
            session.add(ChainLeaseRow(job_id=job.job_id, provider=provider,
                                      price_wei_per_s=terms.price_wei_per_s, term_s=terms.term_s,
                                      accepted_at=accepted_at))
            now = self.desk.now_s()
            # The chain lease books at most its term at its price, whatever top-ups come
            # later: past that the provider's leases of the job stop (the market's
            # allowance), rather than run on for pay the chain cannot book.
            bookable = terms.price_wei_per_s * terms.term_s
            self.desk.command(session, journal.AllowProvider(job=job.job_id, provider=provider,
                                                         wei=bookable), now)
            record_event(session, now, provider, ChainLeaseAccepted(
                chain_job=job.chain_job, price_wei_per_s=terms.price_wei_per_s,
                term_s=terms.term_s, accepted_at=accepted_at, bookable_wei=bookable), job.job_id)

    def tend(self, end_job: EndJob) -> None:
        """Once a round: settle again the ended jobs whose settlement failed, and keep the
        chain jobs of live jobs active (or end, by `end_job`, a live job whose chain job
        was settled or that held no device too long)."""
        if self.settlement is None:
            return
        self._retry_settlements()
        self._end_idle_chain_jobs(end_job)
        self._keep_chain_jobs_active(end_job)

    def _retry_settlements(self) -> None:
        """Until the chain shows it settled, a job's work is unbooked there and a `reclaim`
        would refund it all: a failed settlement is tried again, backing off, each try logged."""
        now = self.desk.now_s()
        with self.store.read() as session:
            unsettled = session.scalars(select(SettlementRow).where(
                SettlementRow.failures > 0, SettlementRow.settled_at_s.is_(None))
                .order_by(SettlementRow.job_id)).all()
        for tries in unsettled:
            job_id = tries.job_id
            wait_s = min(SETTLE_RETRY_MAX_S, SETTLE_RETRY_S * 2 ** (tries.failures - 1))
            if now - tries.failed_at_s < wait_s:
                continue
            log.warning("job %s: retrying its settlement (failed %d times)", job_id, tries.failures)
            with self.desk.change() as session:
                job = session.get(JobRow, job_id)
                self.settle(session, job, self.desk.market.meter(job_id), now)

    def _keep_chain_jobs_active(self, end_job: EndJob) -> None:
        """Work is booked only at a job's end, so while a job is live its chain job must not
        look abandoned: past the contract's silence timeout its submitter could `reclaim` the
        whole escrow. A cheap operator transaction refreshes it well before then."""
        every_s = self.settlement.config.silence_timeout_s / KEEP_ACTIVE_PER_SILENCE
        for job_id, chain_job in self._live_chain_jobs():
            try:
                escrow = self.settlement.escrow(chain_job)
                if escrow.settled_at:
                    end_job(COORDINATOR, job_id, JobStatus.failed,
                                 reason=f"its chain job {chain_job} was settled outside this "
                                        "coordinator: no escrow is left to pay for more work")
                elif self.settlement.keep_active(escrow, every_s):
                    log.info("job %s: chain job %d kept active", job_id, chain_job)
            except (LedgerError, Conflict) as error:  # tried again next round
                log.error("job %s: keeping chain job %d active failed: %s",
                          job_id, chain_job, error)

    def _end_idle_chain_jobs(self, end_job: EndJob) -> None:
        """The accepted leases' collateral stays locked until the job is settled, so a
        job that holds no device (paused, or waiting) is kept alive no longer than the
        contract's silence timeout (`idle_chain_job_s`): then it is ended and settled, its
        providers' stake freed. Else a submitter could pause a job for good and lock its
        providers' stake for as long as this coordinator runs."""
        limit_s = self.settings.idle_chain_job_s or self.settlement.config.silence_timeout_s
        now = self.desk.now_s()
        live = [job_id for job_id, _ in self._live_chain_jobs()]
        with self.store.read() as session:
            accepted = set(session.scalars(select(ChainLeaseRow.job_id).where(
                ChainLeaseRow.job_id.in_(live))))
        for job_id in live:
            idle_s = self._idle_s(job_id, now)
            if job_id in accepted and idle_s > limit_s:
                end_job(COORDINATOR, job_id, JobStatus.cancelled,
                             reason=f"it held no device for {idle_s:.0f} s while its "
                                    "providers' collateral stayed locked on chain: ended and "
                                    "settled (submit a new job, from its checkpoint, to go on)")

    def _live_chain_jobs(self) -> list[tuple[str, int]]:
        """(job, chain job) of every job not ended that settles on chain; waiting ones too:
        a resumed job waits for devices with its earlier work unbooked."""
        with self.store.read() as session:
            return [tuple(row) for row in session.execute(
                select(JobRow.job_id, JobRow.chain_job).where(
                    JobRow.chain_job.is_not(None),
                    JobRow.status.not_in([status.value for status in ENDED])))]

    def _idle_s(self, job_id: str, now: float) -> float:
        """How long the job has held no device (0 while it holds one; since its last lease
        ended; inf if it never held one)."""
        leases = self.desk.market.meter(job_id).leases
        if any(lease.ends_at_s is None or lease.ends_at_s > now for lease in leases):
            return 0.0
        return now - max((lease.ends_at_s for lease in leases), default=-float("inf"))

    def settle(self, session: Session, job: JobRow, meter: Any, now: float) -> None:
        """Book each provider's metered wei (at its chain price, whole seconds) and settle.
        A failure is logged as `settlement_failed`; `tend` tries again."""
        chain_leases = {row.provider: row for row in session.scalars(
            select(ChainLeaseRow).where(ChainLeaseRow.job_id == job.job_id))}
        metered: dict[str, int] = {}
        attended = self.attendance.attended_leases(job.job_id)
        unpaid = sorted(lease.lease for lease in meter.leases if lease.lease not in attended)
        # A contribution without its record cannot be audited: each lease is paid the share
        # of the records its workers owed that they filed (shoal.proof.dues).
        dues = self.record_dues(job.job_id, finished=job.status == JobStatus.finished.value)
        for lease in meter.leases:
            if lease.lease in attended:  # no worker in the job, no pay (attendance.py)
                owed = dues.get(lease.lease, Dues())
                metered[lease.provider] = metered.get(lease.provider, 0) + owed.pay_share(
                    charge_wei(lease, now))
        withheld = {str(n): {"owed": d.owed, "filed": d.filed}
                    for n, d in sorted(dues.items()) if d.missing}
        seconds = {p: wei // chain_leases[p].price_wei_per_s
                   for p, wei in metered.items() if p in chain_leases}
        try:
            escrow = self.settlement.escrow(job.chain_job)
            if escrow.settled_at:  # reclaimed, or settled by a try whose receipt was lost
                log.error("job %s: chain job %s was already settled", job.job_id, job.chain_job)
                record_event(session, now, COORDINATOR, ChainJobClosed(
                    chain_job=job.chain_job, owed_wei=escrow.owed_wei, metered_wei=metered),
                    job.job_id)
                _settlement(session, job.job_id).settled_at_s = now
                return
            booking = self.settlement.settle(job.chain_job, seconds)
        except (LedgerError, Conflict) as error:
            log.error("job %s: settling chain job %s failed: %s", job.job_id, job.chain_job, error)
            record_event(session, now, COORDINATOR, SettlementFailed(
                chain_job=job.chain_job, reason=str(error)), job.job_id)
            tries = _settlement(session, job.job_id)
            tries.failures, tries.failed_at_s = tries.failures + 1, now
            return
        record_event(session, now, COORDINATOR, JobSettled(
            chain_job=job.chain_job, root=booking.root, seconds=booking.seconds, wei=booking.wei,
            metered_wei=metered, unpaid_leases=unpaid, records_withheld=withheld), job.job_id)
        _settlement(session, job.job_id).settled_at_s = now


def _settlement(session: Session, job_id: str) -> SettlementRow:
    """The job's settlement tries, a fresh row before the first."""
    row = session.get(SettlementRow, job_id)
    if row is None:
        row = SettlementRow(job_id=job_id, failures=0)
        session.add(row)
    return row
