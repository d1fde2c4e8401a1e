"""The coordinator's watch over running work, a service it holds: a job
host per job that holds devices, jobs finished or failed by their host's
final word, offers held to the speeds their workers show, leases to their
workers' membership (attendance.py), and agents that went silent reaped so
their leases are replaced."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select

from shoal.coordinator.services import journal
from shoal.coordinator.services.attendance import LeaseAttendance
from shoal.coordinator.services.job_hosts import JobHosts
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.speed_marks import marked_down
from shoal.elastic.job_host import read_speeds
from shoal.coordinator.db.schema import AgentRow, JobRow, LeaseRow, OfferRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.settings import CoordinatorSettings
from shoal.spec.coordinator import COORDINATOR, JobStatus
from shoal.spec.events import JobHostStarted, JobRendezvous, OfferMarkedDown
from shoal.spec.worker import WorkerId


# How long a paused job's ended leases keep its store: their workers' last step and the
# state the last of them writes down (a step and a checkpoint: seconds on these jobs).
PAUSE_LEAVE_S = 30.0


class JobSupervision:
    """Each live job's host started and heard, and the agents behind its leases watched."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 hosts: JobHosts, attendance: LeaseAttendance, end_job: Callable[..., object],
                 withdraw_offer: Callable[..., object],
                 awaiting_records: Callable[[str], bool],
                 job_steps: Callable[[str], int]) -> None:
        """`end_job(actor, job, status, **detail)`: the job lifecycle's;
        `withdraw_offer(actor, offer, reason=...)`: the providers'; `awaiting_records(job)`
        (the proof services'): a finished job's last records are still on their way;
        `job_steps(job)`: the steps its spec asks for (its host ends it there, no sooner)."""
        self.store, self.desk, self.settings, self.hosts = store, desk, settings, hosts
        self.attendance, self.end_job, self.withdraw_offer = attendance, end_job, withdraw_offer
        self.awaiting_records, self.job_steps = awaiting_records, job_steps
        self._speeds_seen: dict[str, int] = {}  # job -> mtime of the speeds last judged
        # Losses count only once agents could have been heard: not just back from a restart.
        self.started_s = desk.now_s()

    def supervise_jobs(self) -> None:
        """Start a host for each job that holds devices; finish jobs whose host says so."""
        with self.store.read() as session:
            live = session.scalars(select(JobRow).where(JobRow.status.in_(
                [JobStatus.waiting.value, JobStatus.running.value, JobStatus.paused.value]))).all()
        for row in live:
            if row.host_pid is None:
                if row.status == JobStatus.running.value:
                    self._start_host(row.job_id, int(row.bid["min_workers"]))
                continue
            state = self.hosts.state(row.job_id, row.host_pid)
            if state.final is not None:
                failed = state.final.get("failed")
                if not failed and self.awaiting_records(row.job_id):
                    continue  # the last steps' records are on their way with the next beats
                self.end_job(COORDINATOR, row.job_id,
                             JobStatus.failed if failed else JobStatus.finished,
                             **({"reason": failed} if failed else state.final))
            elif state.lost:
                self.end_job(COORDINATOR, row.job_id, JobStatus.failed,
                             reason="its job host exited without a final word")
            else:
                if state.rendezvous and state.rendezvous != row.rendezvous:
                    self.record_rendezvous(row.job_id, state.rendezvous)
                self.hold_offers_to_speeds(row.job_id)
                self.attendance.hold_leases_to_membership(row.job_id)
                self.revoke_ended_leases(row.job_id)

    def revoke_ended_leases(self, job_id: str) -> None:
        """Tell the job host's gate which leases ended: their tokens stay valid HMACs, and
        a provider ended for staying out, slashed or preempted must not keep writing the
        job's store (its worker is stopped by its agent; one that is not is cut off).

        A paused job's leases all end at once, and their workers leave as a spot notice
        has them leave: the step in flight is voted on and the last member writes the
        job's state down for whoever resumes it. Cut off at once, that worker failed
        mid-vote and nothing was written: a pause's leases keep the store (still held to
        their own keys) for PAUSE_LEAVE_S after they end."""
        now = self.desk.now_s()
        with self.store.read() as session:
            job = session.get(JobRow, job_id)
            paused = job is not None and job.status == JobStatus.paused.value
            cutoff = now - PAUSE_LEAVE_S if paused else now
            ended = set(session.scalars(select(LeaseRow.lease).where(
                LeaseRow.job_id == job_id, LeaseRow.ends_at_s.is_not(None),
                LeaseRow.ends_at_s <= cutoff)).all())
        self.hosts.revoke(job_id, ended)

    def hold_offers_to_speeds(self, job_id: str) -> None:
        """Mark down the offers whose workers run well below what their agents claimed.

        Judged once per write of the job host's speeds (every 2 s), not every round.
        """
        run_dir = self.hosts.run_dir(job_id)
        try:
            written = (run_dir / "speeds.json").stat().st_mtime_ns
        except FileNotFoundError:
            return
        if self._speeds_seen.get(job_id) == written:
            return
        self._speeds_seen[job_id] = written
        observed_by_worker = read_speeds(run_dir)
        if len(observed_by_worker) < 2:
            return
        with self.store.read() as session:
            offers: dict[str, OfferRow] = {}
            observed: dict[str, float] = {}
            for worker, speed in observed_by_worker.items():
                named = WorkerId.leased(worker)
                lease = session.get(LeaseRow, named.lease) if named is not None else None
                if lease is not None and lease.job_id == job_id:
                    offers[lease.offer_id] = session.get(OfferRow, lease.offer_id)
                    observed[lease.offer_id] = speed
            claimed = {o: row.speed_samples_per_s for o, row in offers.items()}
        for offer_id, speed in marked_down(claimed, observed).items():
            self._mark_down(offer_id, speed, claimed[offer_id], job_id)

    def _mark_down(self, offer_id: str, speed: float, claimed: float, job_id: str) -> None:
        with self.desk.change() as session:
            now, row = self.desk.now_s(), session.get(OfferRow, offer_id)
            if not row.withdrawn:
                offer = self.desk.market.book.offer(offer_id).model_copy(
                    update={"speed_samples_per_s": speed})
                self.desk.command(session, journal.PostOffer(offer=offer), now)
            row.speed_samples_per_s, row.marked_down = speed, True
            record_event(session, now, COORDINATOR, OfferMarkedDown(
                offer_id=offer_id, claimed_samples_per_s=claimed,
                marked_samples_per_s=round(speed, 3)), job_id)

    def _start_host(self, job_id: str, min_workers: int) -> None:
        with self.desk.change() as session:
            row = session.get(JobRow, job_id)
            row.host_pid = self.hosts.start(job_id, min_workers, self.job_steps(job_id))
            record_event(session, self.desk.now_s(), COORDINATOR, JobHostStarted(pid=row.host_pid),
                         job_id)

    def record_rendezvous(self, job_id: str, endpoint: str) -> None:
        """The job's host serves its rendezvous at `endpoint` from now (the grace of a job
        not yet formed runs from this time)."""
        with self.desk.change() as session:
            row = session.get(JobRow, job_id)
            row.rendezvous, row.rendezvous_at_s = endpoint, self.desk.now_s()
            record_event(session, row.rendezvous_at_s, COORDINATOR,
                         JobRendezvous(rendezvous=endpoint), job_id)

    def reap_lost_agents(self) -> list[str]:
        """Withdraw the offers of agents silent past the timeout: their leases end, and the
        next round leases replacements. Returns the agents found lost."""
        now = self.desk.now_s()
        if now - self.started_s < self.settings.agent_timeout_s:
            return []  # back from a restart: no one could be heard while we were down
        with self.store.read() as session:
            lost = session.scalars(select(AgentRow.agent_id).where(
                AgentRow.last_seen_s < now - self.settings.agent_timeout_s)).all()
            offers = session.scalars(select(OfferRow.offer_id).where(
                OfferRow.agent_id.in_(lost), OfferRow.withdrawn.is_(False))).all()
        for offer_id in offers:
            self.withdraw_offer(COORDINATOR, offer_id, reason="agent lost")
        if offers:  # once per loss: a reaped agent has no offers left
            self.attendance.report_lost_workers(list(lost))
        return list(lost) if offers else []
