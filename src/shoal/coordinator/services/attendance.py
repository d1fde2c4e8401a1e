"""Leases held to the job's membership, a service the coordinator holds: a lease is
paid for a worker in the job, not for an agent that says it runs one.

An agent's heartbeat says which leases it runs, but only the job's host
knows who is in the job: its published membership epochs (`epochs.jsonl`).
A provider could keep beating, report its lease running, and never let a
worker join (squatting on a lease: the job runs short, the escrow pays).
So the reconciler holds every running lease to the membership: a lease
whose worker has not been a member for `member_grace_s` (from the lease's
start, or from when its worker dropped out) is ended, its offer withdrawn,
its provider barred from the job (a re-posted offer would win it straight
back), and the market leases a replacement. Before the job's first epoch, when
its workers wait for peers, "in the job" is having asked the host to join:
a squatter would otherwise keep the job from ever forming (its host waits
for `min_workers`) at no cost. And at settlement a lease whose worker
never was a member of any epoch books nothing: no work, no pay.

The other way round, a lost agent's workers are gone with its machine, and
its launcher with them, so no one tells the job's host they exited: a
paused job's last state holder (kept a member to hand its state over)
would then hold the job forever, waiting for it at the next barrier. The
coordinator, which reaps the agent, reports their exits in its place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.errors import ControlError
from shoal.elastic.netaddr import parse_endpoint
from shoal.coordinator.db.schema import JobRow, LeaseRow, OfferRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.services.job_hosts import JobHosts
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.progress import JobProgress
from shoal.coordinator.settings import CoordinatorSettings
from shoal.spec.coordinator import COORDINATOR, JobStatus
from shoal.spec.events import WorkersLost
from shoal.spec.progress import MembershipChange
from shoal.spec.worker import WorkerId

log = logging.getLogger(__name__)
LIVE = (JobStatus.waiting.value, JobStatus.running.value, JobStatus.paused.value)


@dataclass
class _JoinsRead:
    """What a job's host said so far of who asked to join (a request is never taken back,
    so each is read once), while the job has no epoch."""

    seen: int = 0  # join requests read
    leases: set[int] = field(default_factory=set)  # whose workers asked


class LeaseAttendance:
    """Each running lease held to its job's membership, as the job's host publishes it
    (before a job's first epoch: its store, on this machine, inside its gate)."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 hosts: JobHosts, progress: JobProgress,
                 bar_provider: Callable[[str, str, str], None],
                 withdraw_offer: Callable[..., object]) -> None:
        """`bar_provider(job, provider, reason)` and `withdraw_offer(actor, offer, reason=)`:
        the market's, to end a squatter's lease and keep it from winning the job back."""
        self.store, self.desk, self.settings, self.hosts = store, desk, settings, hosts
        self.progress = progress
        self.bar_provider, self.withdraw_offer = bar_provider, withdraw_offer
        self._joins_read: dict[str, _JoinsRead] = {}  # per job not formed yet

    def hold_leases_to_membership(self, job_id: str) -> list[int]:
        """End the running leases of a running job whose workers stayed out of it past the
        grace (before its first epoch: never asked its host to join); returns their
        numbers."""
        changes = self.progress.membership(job_id)
        now, grace = self.desk.now_s(), self.settings.member_grace_s
        with self.store.read() as session:
            job = session.get(JobRow, job_id)
            if job is None or job.status != JobStatus.running.value:
                return []
            # Before the first epoch a worker is in the job once it asks the host to join,
            # which it can only from when the host serves: the grace runs from then too.
            serving_s = None if changes else _serving_since(session, job_id)
            endpoint = self.hosts.store_endpoint(job_id, job.rendezvous)
            leases = session.scalars(select(LeaseRow).where(LeaseRow.job_id == job_id)).all()
            out = [(lease.lease, lease.offer_id, lease.provider) for lease in leases
                   if (lease.ends_at_s is None or lease.ends_at_s > now)
                   and now - absent_since(changes, lease.lease, lease.start_s, serving_s) > grace]
        if changes:
            self._joins_read.pop(job_id, None)
        elif out:  # not formed yet: out of it is never having asked to join
            out = self._never_asked_to_join(job_id, endpoint, out)
        for number, offer_id, provider in out:
            reason = (f"the worker of lease {number} stayed out of job {job_id} for more than "
                      f"{grace:.0f} s (an agent that reports a lease running must have its "
                      "worker in the job)")
            self.bar_provider(job_id, provider, reason)  # re-posting must not win it back
            self.withdraw_offer(COORDINATOR, offer_id, reason=reason)
        return [number for number, _, _ in out]

    def _never_asked_to_join(self, job_id: str, endpoint: str | None,
                             leases: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
        """Of `leases` (number, offer, provider), those whose workers never asked the job's
        host to join; none while the host cannot be read (nobody is judged on its silence)."""
        read = self._joins_read.get(job_id, _JoinsRead())
        if any(lease[0] not in read.leases for lease in leases):  # the host is asked only then
            if not self._read_joins(job_id, endpoint, read):
                return []
        return [lease for lease in leases if lease[0] not in read.leases]

    def _read_joins(self, job_id: str, endpoint: str | None, read: _JoinsRead) -> bool:
        """Read on the job's host's join requests into `read`; False if it cannot be read."""
        from shoal.train.rendezvous import Rendezvous, RendezvousError, connect

        if endpoint is None:
            return False
        host, port = parse_endpoint(endpoint)
        try:
            seen, workers = Rendezvous(connect(host, port, timeout_s=5.0)).joins_since(read.seen)
        except RendezvousError as error:
            log.warning("job %s: could not read who asked its host to join: %s", job_id, error)
            return False
        read.seen = seen
        read.leases |= {w.lease for w in map(WorkerId.leased, workers) if w is not None}
        self._joins_read[job_id] = read
        return True

    def report_lost_workers(self, agents: list[str]) -> dict[str, list[str]]:
        """Tell each live job's host that the members run by `agents` (lost) exited, as
        their launchers would have; returns job -> workers reported."""
        if not agents:
            return {}
        found: list[tuple[str, str, list[str]]] = []  # (job, its host's endpoint, workers)
        with self.store.read() as session:
            jobs = session.scalars(select(JobRow).where(JobRow.status.in_(LIVE),
                                                        JobRow.rendezvous.is_not(None))).all()
            for job in jobs:
                changes = self.progress.membership(job.job_id)
                gone = [w for w in (changes[-1].members if changes else ())
                        if _agent_of(session, job.job_id, w) in agents]
                endpoint = self.hosts.store_endpoint(job.job_id, job.rendezvous)
                if gone and endpoint:
                    found.append((job.job_id, endpoint, gone))
        reported = {}
        for job_id, endpoint, workers in found:
            try:
                _report_exits(endpoint, workers)
            except ControlError as error:
                log.warning("job %s: could not tell its host that %s exited: %s", job_id,
                            ", ".join(workers), error)
                continue
            log.warning("job %s: %s lost with their agent; exits reported to the job's host",
                        job_id, ", ".join(workers))
            with self.desk.change() as session:
                record_event(session, self.desk.now_s(), COORDINATOR, WorkersLost(workers=workers),
                             job_id)
            reported[job_id] = workers
        return reported

    def attended_leases(self, job_id: str) -> set[int]:
        """Leases whose worker was a member of at least one of the job's epochs."""
        return {w.lease for change in self.progress.membership(job_id)
                for w in map(WorkerId.leased, change.members) if w is not None}


def absent_since(changes: list[MembershipChange], lease: int, start_s: float,
                 serving_s: float | None = None) -> float:
    """Since when `lease`'s worker has been out of the job: the first epoch of the trailing
    run without it (or its lease's start, if later); +inf when it is a member now. With no
    epoch yet, since its lease's start or the host's serving (`serving_s`), the later;
    +inf if the host does not serve yet."""
    if not changes:
        return float("inf") if serving_s is None else max(start_s, serving_s)
    since = None
    for change in reversed(changes):
        if any(w is not None and w.lease == lease for w in map(WorkerId.leased, change.members)):
            break
        since = change.t
    if since is None:
        return float("inf")
    return max(since, start_s)


def _serving_since(session: Session, job_id: str) -> float | None:
    """When the coordinator recorded the job's host serving (its newest endpoint), or None."""
    return session.scalar(select(JobRow.rendezvous_at_s).where(JobRow.job_id == job_id))


def _agent_of(session: Session, job_id: str, worker: str) -> str | None:
    """The agent running `worker` on one of the job's leases, or None."""
    named = WorkerId.leased(worker)
    lease = session.get(LeaseRow, named.lease) if named is not None else None
    if lease is None or lease.job_id != job_id:
        return None
    offer = session.get(OfferRow, lease.offer_id)
    return offer.agent_id if offer is not None else None


def _report_exits(endpoint: str, workers: list[str]) -> None:
    from shoal.train.rendezvous import Rendezvous, RendezvousError, connect

    host, port = parse_endpoint(endpoint)
    try:
        rdzv = Rendezvous(connect(host, port, timeout_s=5.0))
        for worker in workers:
            rdzv.report_exit(worker)
    except RendezvousError as error:
        raise ControlError(str(error)) from None

