"""The coordinator's audit log as a typed union: one frozen model per kind of event,
its detail as typed fields. The kinds' names and the detail's JSON are what the log
has always stored and served, so older rows read back as these models too."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import Field, PlainSerializer, TypeAdapter

from shoal.spec.base import Frozen
from shoal.spec.coordinator import JobStatus
from shoal.spec.market import FillStatus
from shoal.spec.progress import JobPlanView
from shoal.spec.proof import Ruling

# Wei are decimal text in the log: a JSON reader that parses numbers as floats would
# round them.
WeiText = Annotated[int, PlainSerializer(str, return_type=str)]


class EventKind(enum.StrEnum):
    agent_registered = "agent_registered"
    offer_posted = "offer_posted"
    offer_withdrawn = "offer_withdrawn"
    offer_marked_down = "offer_marked_down"
    provider_barred = "provider_barred"
    provider_term_spent = "provider_term_spent"
    registered = "registered"
    granted = "granted"
    job_submitted = "job_submitted"
    job_topped_up = "job_topped_up"
    job_paused = "job_paused"
    job_resumed = "job_resumed"
    job_finished = "job_finished"
    job_cancelled = "job_cancelled"
    job_failed = "job_failed"
    job_filled = "job_filled"
    job_host_started = "job_host_started"
    job_rendezvous = "job_rendezvous"
    job_planned = "job_planned"
    workers_lost = "workers_lost"
    checkpoint_carried = "checkpoint_carried"
    chain_lease_accepted = "chain_lease_accepted"
    chain_job_closed = "chain_job_closed"
    settlement_failed = "settlement_failed"
    job_settled = "job_settled"
    work_records_stored = "work_records_stored"
    proof_epoch_rooted = "proof_epoch_rooted"
    proof_epoch_served = "proof_epoch_served"
    challenge_raised = "challenge_raised"
    challenge_answered = "challenge_answered"
    params_refused = "params_refused"
    params_rerouted = "params_rerouted"
    verdicts_filed = "verdicts_filed"
    verdict_upheld = "verdict_upheld"
    verdict_rejected = "verdict_rejected"
    verdict_undecided = "verdict_undecided"
    worker_slashed = "worker_slashed"
    verifier_slashed = "verifier_slashed"
    forced_errors_committed = "forced_errors_committed"
    forced_errors_revealed = "forced_errors_revealed"
    forced_error_missed = "forced_error_missed"
    dispute_filed = "dispute_filed"
    dispute_upheld = "dispute_upheld"
    dispute_rejected = "dispute_rejected"
    dispute_undecided = "dispute_undecided"
    dispute_enforced = "dispute_enforced"
    dispute_dismissed = "dispute_dismissed"


class Audited(Frozen):
    """An event's detail: only the fields its writer gave are stored, as they always were."""

    def detail(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True, exclude={"kind"})


class ChainNote(Audited):
    """A contract transaction the event caused: its hash, or why the contract refused it."""

    tx: str | None = None
    chain_error: str | None = None


# ------------------------------------------------------------ the market
class AgentRegistered(Audited):
    kind: Literal[EventKind.agent_registered] = EventKind.agent_registered
    agent_id: str
    region: str
    devices: list[dict[str, Any]]  # Preflight values, as measured


class OfferPosted(Audited):
    kind: Literal[EventKind.offer_posted] = EventKind.offer_posted
    offer_id: str
    price_wei_per_s: WeiText
    tenancy: str


class OfferWithdrawn(Audited):
    kind: Literal[EventKind.offer_withdrawn] = EventKind.offer_withdrawn
    offer_id: str
    reason: str
    ended_leases: list[int]


class OfferMarkedDown(Audited):
    kind: Literal[EventKind.offer_marked_down] = EventKind.offer_marked_down
    offer_id: str
    claimed_samples_per_s: float
    marked_samples_per_s: float


class ProviderBarred(Audited):
    kind: Literal[EventKind.provider_barred] = EventKind.provider_barred
    provider: str
    reason: str


class ProviderTermSpent(Audited):
    kind: Literal[EventKind.provider_term_spent] = EventKind.provider_term_spent
    provider: str
    reason: str


class Registered(Audited):
    kind: Literal[EventKind.registered] = EventKind.registered
    role: str
    name: str


class Granted(Audited):
    kind: Literal[EventKind.granted] = EventKind.granted
    address: str
    role: str
    max_priority: int


# ------------------------------------------------------------ jobs
class JobSubmitted(Audited):
    kind: Literal[EventKind.job_submitted] = EventKind.job_submitted
    workers: int
    budget_wei: WeiText
    max_price_wei_per_s: WeiText


class JobToppedUp(Audited):
    kind: Literal[EventKind.job_topped_up] = EventKind.job_topped_up
    amount_wei: WeiText


class JobPaused(Audited):
    kind: Literal[EventKind.job_paused] = EventKind.job_paused


class JobResumed(Audited):
    kind: Literal[EventKind.job_resumed] = EventKind.job_resumed


class JobEnded(Audited):
    """A job's end, whatever it was: `reason` when it failed or was ended, `final` (the
    job host's last word) when it finished."""

    spent_wei: WeiText
    reason: str | None = None
    final: dict[str, Any] | None = None


class JobFinished(JobEnded):
    kind: Literal[EventKind.job_finished] = EventKind.job_finished


class JobCancelled(JobEnded):
    kind: Literal[EventKind.job_cancelled] = EventKind.job_cancelled


class JobFailed(JobEnded):
    kind: Literal[EventKind.job_failed] = EventKind.job_failed


JOB_ENDS: dict[JobStatus, type[JobEnded]] = {
    JobStatus.finished: JobFinished, JobStatus.cancelled: JobCancelled,
    JobStatus.failed: JobFailed}


class JobFilled(Audited):
    kind: Literal[EventKind.job_filled] = EventKind.job_filled
    status: FillStatus
    held: int
    reason: str
    new_leases: list[int]
    notices: list[int]  # leases of other jobs given notice


class JobHostStarted(Audited):
    kind: Literal[EventKind.job_host_started] = EventKind.job_host_started
    pid: int | None


class JobRendezvous(Audited):
    kind: Literal[EventKind.job_rendezvous] = EventKind.job_rendezvous
    rendezvous: str  # HOST:PORT


class JobPlanned(JobPlanView, Audited):
    """The plan, its fields at the top of the detail as the log has always held them."""

    kind: Literal[EventKind.job_planned] = EventKind.job_planned


class WorkersLost(Audited):
    kind: Literal[EventKind.workers_lost] = EventKind.workers_lost
    workers: list[str]


class CheckpointCarried(Audited):
    kind: Literal[EventKind.checkpoint_carried] = EventKind.checkpoint_carried
    step: int
    lease: int
    bytes: int
    sha256: str
    verified: bool


# ------------------------------------------------------------ settlement on chain
class ChainLeaseAccepted(Audited):
    kind: Literal[EventKind.chain_lease_accepted] = EventKind.chain_lease_accepted
    chain_job: int
    price_wei_per_s: WeiText
    term_s: int
    accepted_at: int  # chain time
    bookable_wei: WeiText


class ChainJobClosed(Audited):
    kind: Literal[EventKind.chain_job_closed] = EventKind.chain_job_closed
    chain_job: int
    owed_wei: WeiText
    metered_wei: dict[str, WeiText]


class SettlementFailed(Audited):
    kind: Literal[EventKind.settlement_failed] = EventKind.settlement_failed
    chain_job: int
    reason: str


class JobSettled(Audited):
    kind: Literal[EventKind.job_settled] = EventKind.job_settled
    chain_job: int
    root: str
    seconds: dict[str, int]
    wei: dict[str, WeiText]
    metered_wei: dict[str, WeiText]
    unpaid_leases: list[int]
    records_withheld: dict[str, dict[str, int]]  # lease: owed and filed records


# ------------------------------------------------------------ proofs
class WorkRecordsStored(Audited):
    kind: Literal[EventKind.work_records_stored] = EventKind.work_records_stored
    lease: int
    records: int
    steps: tuple[int, int]  # the first and the last


class ProofEpochRooted(Audited):
    kind: Literal[EventKind.proof_epoch_rooted] = EventKind.proof_epoch_rooted
    epoch: int
    root: str
    records: int
    complete: bool
    chain_epoch: int | None


class ProofEpochServed(Audited):
    kind: Literal[EventKind.proof_epoch_served] = EventKind.proof_epoch_served
    epoch: int
    root: str | None


class ChallengeRaised(Audited):
    kind: Literal[EventKind.challenge_raised] = EventKind.challenge_raised
    challenge: int
    worker: str
    step: int
    blob: str
    agent_id: str


class ChallengeAnswered(Audited):
    kind: Literal[EventKind.challenge_answered] = EventKind.challenge_answered
    challenge: int
    bytes: int
    sha256: str | None


class ParamsRefused(Audited):
    kind: Literal[EventKind.params_refused] = EventKind.params_refused
    challenge: int
    step: int
    keeper: str
    why: str


class ParamsRerouted(Audited):
    kind: Literal[EventKind.params_rerouted] = EventKind.params_rerouted
    challenge: int
    step: int
    keeper: str
    to: str
    agent_id: str
    why: str


class VerdictsFiled(Audited):
    kind: Literal[EventKind.verdicts_filed] = EventKind.verdicts_filed
    kinds: dict[str, int]
    guilty: list[tuple[str, int, str]]  # worker, step, verdict kind


class VerdictRuled(ChainNote):
    """The referee's ruling on a guilty verdict (the first upheld one slashes)."""

    verdict: int
    worker: str
    step: int
    verifier: str
    provider: str | None
    why: str


class VerdictUpheld(VerdictRuled):
    kind: Literal[EventKind.verdict_upheld] = EventKind.verdict_upheld


class VerdictRejected(VerdictRuled):
    kind: Literal[EventKind.verdict_rejected] = EventKind.verdict_rejected


class VerdictUndecided(VerdictRuled):
    kind: Literal[EventKind.verdict_undecided] = EventKind.verdict_undecided


class WorkerSlashed(VerdictRuled):
    kind: Literal[EventKind.worker_slashed] = EventKind.worker_slashed


VERDICT_RULINGS: dict[Ruling, type[VerdictRuled]] = {
    Ruling.upheld: VerdictUpheld, Ruling.rejected: VerdictRejected}  # else undecided


class VerifierSlashed(ChainNote):
    kind: Literal[EventKind.verifier_slashed] = EventKind.verifier_slashed
    verifier: str
    worker: str
    step: int
    shown_by: str


class ForcedErrorsCommitted(Audited):
    kind: Literal[EventKind.forced_errors_committed] = EventKind.forced_errors_committed
    commitment: str
    rate: float


class ForcedErrorsRevealed(Audited):
    kind: Literal[EventKind.forced_errors_revealed] = EventKind.forced_errors_revealed
    secret: str
    commitment: str
    rate: float
    plants: list[tuple[int, str, int, str]]  # epoch, worker, step, state
    missed: list[tuple[str, str, int]]  # verifier, worker, step


class ForcedErrorMissed(ChainNote):
    kind: Literal[EventKind.forced_error_missed] = EventKind.forced_error_missed
    verdict: int
    verifier: str
    worker: str
    step: int


# ------------------------------------------------------------ disputes
class DisputeFiled(Audited):
    kind: Literal[EventKind.dispute_filed] = EventKind.dispute_filed
    dispute: int
    worker: str
    epoch: int
    provider: str
    bond_wei: WeiText


class DisputeRuled(ChainNote):
    dispute: int
    worker: str
    step: int | None
    provider: str
    challenger: str
    why: str
    chain: str | None  # the dispute's state on chain, or why the ruling waits


class DisputeUpheld(DisputeRuled):
    kind: Literal[EventKind.dispute_upheld] = EventKind.dispute_upheld


class DisputeRejected(DisputeRuled):
    kind: Literal[EventKind.dispute_rejected] = EventKind.dispute_rejected


class DisputeUndecided(DisputeRuled):
    kind: Literal[EventKind.dispute_undecided] = EventKind.dispute_undecided


DISPUTE_RULINGS: dict[Ruling, type[DisputeRuled]] = {
    Ruling.upheld: DisputeUpheld, Ruling.rejected: DisputeRejected,
    Ruling.undecided: DisputeUndecided}


class DisputeEnforced(ChainNote):
    kind: Literal[EventKind.dispute_enforced] = EventKind.dispute_enforced
    dispute: int
    ruling: Ruling
    chain: str | None


class DisputeDismissed(ChainNote):
    kind: Literal[EventKind.dispute_dismissed] = EventKind.dispute_dismissed
    dispute: int
    provider: str
    challenger: str
    bond_wei: WeiText
    opened_at: int  # chain time
    why: str


AuditEvent = Annotated[Union[
    AgentRegistered, OfferPosted, OfferWithdrawn, OfferMarkedDown, ProviderBarred,
    ProviderTermSpent, Registered, Granted, JobSubmitted, JobToppedUp, JobPaused, JobResumed,
    JobFinished, JobCancelled, JobFailed, JobFilled, JobHostStarted, JobRendezvous,
    JobPlanned, WorkersLost, CheckpointCarried, ChainLeaseAccepted, ChainJobClosed,
    SettlementFailed, JobSettled, WorkRecordsStored, ProofEpochRooted, ProofEpochServed,
    ChallengeRaised, ChallengeAnswered, ParamsRefused, ParamsRerouted, VerdictsFiled,
    VerdictUpheld, VerdictRejected, VerdictUndecided, WorkerSlashed, VerifierSlashed,
    ForcedErrorsCommitted, ForcedErrorsRevealed, ForcedErrorMissed, DisputeFiled,
    DisputeUpheld, DisputeRejected, DisputeUndecided, DisputeEnforced, DisputeDismissed,
], Field(discriminator="kind")]

_AUDIT_EVENT: TypeAdapter[AuditEvent] = TypeAdapter(AuditEvent)


def audit_event(kind: str, detail: Mapping[str, Any]) -> AuditEvent:
    """The typed event a stored (or served) kind and detail hold."""
    return _AUDIT_EVENT.validate_python({**detail, "kind": kind})
