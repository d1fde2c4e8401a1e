"""Jobs as their submitters drive them, a service the coordinator holds: submitted
(the job file checked as a provider's agent would check it, the escrow on
chain when there is one), topped up (a job paused for want of escrow
resumes), paused and resumed, and ended (every lease ends at once; the last
proof epochs are rooted and the bill settled on chain)."""

from __future__ import annotations

import secrets
import tomllib
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from shoal.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.coordinator.services import journal
from shoal.coordinator.services.bundles import JobSecrets
from shoal.coordinator.services.chain_jobs import ChainSettlement
from shoal.coordinator.services.job_hosts import JobHosts
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.participants import Participants
from shoal.coordinator.services.settlement import Settlement
from shoal.coordinator.services.views import job_view
from shoal.coordinator.db.schema import JobRow
from shoal.coordinator.db.store import record_event
from shoal.coordinator.settings import CoordinatorSettings
from shoal.spec.bundle import BundleManifest
from shoal.spec.coordinator import COORDINATOR, ENDED, JobStatus, JobSubmission, JobView, Role
from shoal.spec.errors import SpecError
from shoal.spec.events import JOB_ENDS, JobPaused, JobResumed, JobSubmitted, JobToppedUp
from shoal.spec.job import JobSpec
from shoal.spec.jobfile import parse_job, refuse_for_providers
from shoal.spec.market import Bid

# The shortest challenge window taken, in beats: a verifier must see the epoch served,
# ask, and the agent hear the challenge at its next beat and answer at the one after.
WINDOW_BEATS = 5

# The proof services' last word on an ending job, in its closing transaction: the last
# epochs rooted (and anchored) before the bill is.
CloseProofs = Callable[[Session, JobRow], None]


class JobLifecycle:
    """A submitter's jobs from submission to their end, each change one transaction."""

    def __init__(self, desk: MarketDesk, settings: CoordinatorSettings,
                 participants: Participants, hosts: JobHosts, settlement: Settlement | None,
                 chain: ChainSettlement, close_proofs: CloseProofs,
                 check_bundle: Callable[[str, str], BundleManifest],
                 secrets: JobSecrets) -> None:
        """`settlement` None: escrow is the store's bookkeeping only; else `chain` holds
        each job to its escrow on chain and settles it at its end. `check_bundle(submitter,
        sha256)` raises unless a job of the submitter's may name that bundle (and answers its
        manifest: the job's bid asks for devices on the bundle's torch release)."""
        self.desk, self.settings, self.participants, self.hosts = desk, settings, \
            participants, hosts
        self.settlement, self.chain, self.close_proofs = settlement, chain, close_proofs
        self.check_bundle, self.secrets = check_bundle, secrets

    def submit(self, submitter: str, submission: JobSubmission) -> JobView:
        """Take a job whose job file providers would run, against its escrow."""
        spec = _check_job_file(submission.job_file)
        torch = None
        if spec.bundle is not None:
            torch = self.check_bundle(submitter, spec.bundle.sha256).torch
        elif submission.secret_env:
            raise SpecError("secret_env is for a bundled job's script (a job file with "
                            "[bundle]); the built-in trainer reads no variables")
        size = 4 * spec.model.parameters()  # float32: what a `params` file of it holds
        if size > self.settings.max_file_bytes:
            # The coordinator builds the model to check carried checkpoints and plant
            # forced errors, and takes its parameters as challenge files: a job file asking
            # for 51 billion parameters would take it down (issue 40, point 10).
            raise SpecError(f"job_file: the model has {spec.model.parameters():,} parameters "
                            f"({size / 2**20:,.0f} MiB in float32), more than this coordinator "
                            f"takes in one file ({self.settings.max_file_bytes / 2**20:,.0f} MiB, "
                            "--max-file-bytes): its parameters could never be audited here; "
                            "make [model] smaller or ask the operator to raise the limit")
        shortest = WINDOW_BEATS * self.settings.heartbeat_s
        if spec.proof.enabled and spec.proof.keep_s < shortest:
            raise SpecError(f"job_file: [proof] keep_s = {spec.proof.keep_s:g} s is the challenge "
                            "window (how long after an epoch is served verifiers may ask for its "
                            f"files); at least {shortest:g} s ({WINDOW_BEATS} beats) is needed for "
                            "anyone to ask and an agent to answer: raise it")
        self.participants.check_priority(submitter, submission.priority)
        self.chain.check_escrow(submitter, submission)
        job_id = f"{submission.name}-{secrets.token_hex(4)}"
        # On a chain, one device per provider: the contract holds one lease per job and
        # provider, booked for at most the time since it was accepted, so a provider's
        # second device in the job would work unpaid.
        bid = Bid(job=job_id, max_devices_per_provider=1 if submission.chain_job else None,
                  torch=torch,
                  **submission.model_dump(exclude={"name", "job_file", "chain_job",
                                                   "secret_env"}))
        with self.desk.change() as session:
            self.chain.refuse_used_chain_job(session, submission.chain_job)  # under the lock: once
            now = self.desk.now_s()
            self.desk.command(session, journal.Submit(bid=bid), now)
            row = JobRow(job_id=job_id, name=submission.name, submitter=submitter,
                         job_file=submission.job_file, bid=bid.model_dump(mode="json"),
                         status=JobStatus.waiting.value, created_at_s=now,
                         chain_job=submission.chain_job)
            session.add(row)
            self.secrets.keep(job_id, submission.secret_env)  # never in the store or a log
            record_event(session, now, submitter, JobSubmitted(
                workers=bid.workers, budget_wei=bid.budget_wei,
                max_price_wei_per_s=bid.max_price_wei_per_s), job_id)
            return job_view(row, self.desk.market.meter(job_id), now)

    def top_up(self, submitter: str, job_id: str, amount_wei: int) -> JobView:
        """Add escrow; a job paused for want of it resumes at the next round."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = self._own_job(session, submitter, job_id)
            if self.settlement is not None and row.chain_job is not None:
                budget = self.desk.market.meter(job_id).budget_wei + amount_wei
                self.settlement.check_escrow(row.chain_job, submitter, budget,
                                             int(row.bid["max_price_wei_per_s"]))
            self.desk.command(session, journal.TopUp(job=job_id, amount_wei=amount_wei), now)
            if row.status == JobStatus.paused.value:
                self.desk.command(session, journal.Resume(job=job_id), now)
                row.status = JobStatus.waiting.value
            record_event(session, now, submitter, JobToppedUp(amount_wei=amount_wei), job_id)
            return job_view(row, self.desk.market.meter(job_id), now)

    def set_paused(self, actor: str, job_id: str, paused: bool) -> JobView:
        """Pause (its leases end, its escrow waits) or resume a job."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = self._own_job(session, actor, job_id)
            if paused:
                ended = self.desk.command(session, journal.Pause(job=job_id), now)
                self.desk.store_leases(session, ended)
                row.status = JobStatus.paused.value
            else:
                self.desk.command(session, journal.Resume(job=job_id), now)
                row.status = JobStatus.waiting.value
            record_event(session, now, actor, JobPaused() if paused else JobResumed(), job_id)
            return job_view(row, self.desk.market.meter(job_id), now)

    def end(self, actor: str, job_id: str, status: JobStatus, **detail: Any) -> JobView:
        """Finish or cancel: every lease ends now, so nothing bills idle."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = self._own_job(session, actor, job_id)
            meter = self.desk.command(session, journal.Finish(job=job_id), now)
            self.desk.store_leases(session, meter.leases)
            row.status = status.value
            record_event(session, now, actor, JOB_ENDS[status](
                spent_wei=meter.accrued_wei(now), **detail), job_id)
            if status is not JobStatus.finished:
                self.hosts.stop(job_id, row.host_pid)
            self.secrets.forget(job_id)
            self.close_proofs(session, row)  # the last epochs' roots go before the bill
            if self.settlement is not None and row.chain_job is not None:
                self.chain.settle(session, row, meter, now)
            return job_view(row, meter, now)

    def _own_job(self, session: Session, actor: str, job_id: str) -> JobRow:
        row = session.get(JobRow, job_id)
        if row is None:
            raise NotFound(f"no job '{job_id}'")
        if actor not in (row.submitter, COORDINATOR) \
                and self.participants.role_of(actor) is not Role.operator:
            raise Forbidden(f"job '{job_id}' belongs to another submitter")
        if JobStatus(row.status) in ENDED:
            raise Conflict(f"job '{job_id}' is {row.status}; submit a new job")
        return row


def _check_job_file(text: str) -> JobSpec:
    """Refuse a job file `shoal train` would refuse, before anyone is paid to run it."""
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"job_file: malformed TOML ({error})") from None
    spec = parse_job(values, source="job_file")
    refuse_for_providers(spec)
    return spec
