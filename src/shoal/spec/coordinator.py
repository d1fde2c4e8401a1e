"""Values that cross the coordinator's HTTP API: who is calling, what they
register, offer and submit, and what the coordinator answers.

The market's own values (offers, bids, leases) live in `spec.market`; these
wrap them with the identity of the caller, who never states it in a body:
the coordinator takes it from the request's signature.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from shoal.spec.audit import ChallengeView
from shoal.spec.bundle import TorchRelease
from shoal.spec.job import Frozen, script_env
from shoal.spec.market import DeviceLease, Name, PricePerSecond, Tenancy

Address = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{40}$")]
Label = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
# A job file is small text; anything larger is refused before it is parsed.
JOB_FILE_MAX_CHARS = 64 * 1024
# Listings (participants, jobs, agents, offers, providers) come a page at a time: rows
# after the `after` key given (the last of the page before), `limit` of them at most.
DEFAULT_PAGE = 100
MAX_PAGE = 1000


class Role(str, enum.Enum):
    """What a key may do. Submitters and providers register themselves;
    verifiers are named by an operator; operators by the coordinator's settings."""

    submitter = "submitter"
    provider = "provider"
    verifier = "verifier"
    operator = "operator"


SELF_SERVICE_ROLES = frozenset({Role.submitter, Role.provider})
COORDINATOR = "coordinator"  # the actor of the coordinator's own decisions in the audit log


class Registration(Frozen):
    """A key asks for a role under a display name."""

    role: Role
    name: Label


class Participant(Frozen):
    address: Address
    role: Role
    name: Label
    registered_at_s: float
    max_priority: int = 0  # the highest priority its jobs may take (a submitter's)


class Grant(Frozen):
    """An operator gives a role (verifier, operator) to another key, or a submitter a
    priority ceiling: a job above priority 0 takes spot devices from others' jobs, so
    that is granted, not taken (`max_priority`; unchanged when not given)."""

    address: Address
    role: Role
    name: Label
    max_priority: int | None = Field(None, ge=-1_000_000, le=1_000_000)


class Backend(str, enum.Enum):
    gloo = "gloo"
    nccl = "nccl"


class Preflight(Frozen):
    """What an agent measured on its own device before offering it.

    The link figures are the coordinator's probe's (`ProbeRendezvous`): the
    coordinator times the collectives on its own side and records what it saw
    in place of whatever an agent states. None: no probe of this coordinator
    measured them.
    """

    device_kind: Name
    speed_samples_per_s: float = Field(gt=0.0, le=1e9)
    memory_gb: float = Field(gt=0.0, le=1e6)
    backend: Backend = Backend.gloo
    torch: TorchRelease | None = None  # the release the agent's workers run on
    collective_ok: bool  # a collective with the coordinator's probe completed
    rtt_ms: float | None = Field(None, gt=0.0, le=600_000.0)  # a one-float all-reduce, median
    # A two-rank all-reduce of a few MiB: payload bits over the median time (what
    # nccl-tests calls algorithm bandwidth; for two ranks, also the bus bandwidth).
    bandwidth_gbps: float | None = Field(None, gt=0.0, le=10_000.0)

    @model_validator(mode="after")
    def _figures_need_a_collective(self) -> Preflight:
        if not self.collective_ok and (self.rtt_ms is not None or self.bandwidth_gbps is not None):
            raise ValueError("rtt_ms and bandwidth_gbps are measured by a collective; "
                             "with collective_ok false there are none")
        return self


# Bounds an agent holds a probe's plan to: a coordinator cannot make it send more.
PROBE_MAX_PAYLOAD_BYTES = 16 * 2**20
PROBE_MAX_ROUNDS = 16


class ProbeRendezvous(Frozen):
    """The coordinator's answer to an agent's signed probe request: where to join
    its two-rank gloo group, under which one-time key, and the collectives to run.

    The host is not named: an agent joins on the host it already calls the
    coordinator at, so a reply cannot steer it elsewhere.
    """

    port: int = Field(ge=1, le=65535)  # a TCPStore open for this probe only
    key: str = Field(pattern=r"^[0-9a-f]{32}$")  # the store prefix of this probe's group
    deadline_s: float = Field(gt=0.0, le=300.0)  # the probe gives up this long after it opened
    rtt_rounds: int = Field(ge=1, le=PROBE_MAX_ROUNDS)  # one-float all-reduces, timed
    bandwidth_rounds: int = Field(ge=1, le=PROBE_MAX_ROUNDS)  # payload all-reduces, timed
    payload_bytes: int = Field(ge=4, le=PROBE_MAX_PAYLOAD_BYTES, multiple_of=4)  # float32


class AgentRegistration(Frozen):
    """An agent (a provider's machine) and the devices it measured."""

    agent_id: Label
    region: Name
    devices: tuple[Preflight, ...] = Field(min_length=1, max_length=64)


class AgentView(Frozen):
    agent_id: Label
    provider: Address
    region: Name
    devices: tuple[Preflight, ...]
    registered_at_s: float
    last_seen_s: float
    online: bool


class OfferTerms(Frozen):
    """A device of a registered agent put on the market at a price.

    Speed and memory are not stated here: they are the agent's measured
    figures, so a provider cannot claim more than its pre-flight showed.
    """

    offer_id: Label
    agent_id: Label
    device: int = Field(0, ge=0, le=63)  # index into the agent's measured devices
    price_wei_per_s: PricePerSecond
    tenancy: Tenancy = Tenancy.spot


class OfferView(Frozen):
    offer_id: Label
    provider: Address
    agent_id: Label
    device_kind: Name
    region: Name
    speed_samples_per_s: float  # what the market uses: measured, marked down if not met
    memory_gb: float
    price_wei_per_s: int
    tenancy: Tenancy
    reference_wei_per_s: int | None
    withdrawn: bool
    marked_down: bool


class JobSubmission(Frozen):
    """A job file and the terms its submitter will pay on."""

    name: Label
    job_file: str = Field(min_length=1, max_length=JOB_FILE_MAX_CHARS)  # TOML, as `shoal train` reads
    workers: int = Field(ge=1, le=1024)
    min_workers: int = Field(1, ge=1, le=1024)
    min_speed_samples_per_s: float = Field(0.0, ge=0.0, le=1e9)
    min_memory_gb: float = Field(0.0, ge=0.0, le=1e6)
    regions: frozenset[Name] = Field(frozenset(), max_length=64)
    tenancies: frozenset[Tenancy] = frozenset(Tenancy)
    max_price_wei_per_s: PricePerSecond
    # Nothing escrowed pays for nothing: a job with no budget would wait, paused, for ever.
    budget_wei: Annotated[int, Field(ge=1)]
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    # The job on the settlement contract whose escrow backs this budget
    # (required by a coordinator that settles on a chain).
    chain_job: int | None = Field(None, ge=1)
    # Variables a bundled job's script gets that are not in its (public) job file: the
    # data's credentials. Kept by the coordinator, sent only with each running lease's
    # assignment to its provider, and forgotten when the job ends.
    secret_env: dict[str, Annotated[str, Field(max_length=4096)]] = Field({}, max_length=16)

    @field_validator("secret_env")
    @classmethod
    def _script_variables(cls, env: dict[str, str]) -> dict[str, str]:
        return script_env(env, "secret_env")

    @model_validator(mode="after")
    def _min_fits(self) -> JobSubmission:
        if self.min_workers > self.workers:
            raise ValueError(f"min_workers ({self.min_workers}) must not exceed workers ({self.workers})")
        if not self.tenancies:
            raise ValueError("tenancies must name at least one of 'spot', 'on_demand'")
        return self


class JobStatus(str, enum.Enum):
    waiting = "waiting"  # fewer than min_workers leased
    running = "running"
    paused = "paused"  # out of escrow or paused by its submitter; resumes when topped up
    finished = "finished"
    cancelled = "cancelled"
    failed = "failed"  # given up by its authority, or its job host was lost


ENDED = frozenset({JobStatus.finished, JobStatus.cancelled, JobStatus.failed})


class TopUp(Frozen):
    amount_wei: int = Field(ge=1)


class JobView(Frozen):
    job_id: Label
    name: Label
    submitter: Address
    status: JobStatus
    workers: int
    max_price_wei_per_s: int
    budget_wei: int
    spent_wei: int  # billed by now, per second of each lease
    remaining_wei: int
    priority: int
    leases: tuple[DeviceLease, ...]  # which devices each lease holds, ended ones included
    created_at_s: float
    rendezvous: str | None = None  # the job host's HOST:PORT once it serves
    chain_job: int | None = None
    # The submitter's own code it runs (the bundle's SHA-256; None: the built-in GPT).
    bundle_sha256: str | None = None


class AcceptanceTerms(Frozen):
    """A chain lease a provider is asked to accept by signature (EIP-712, see
    shoal.ledger.acceptance): this contract on this chain, this job, these terms."""

    chain_id: int = Field(ge=1)
    contract: Address
    chain_job: int = Field(ge=1)
    price_wei_per_s: int = Field(ge=1)
    term_s: int = Field(ge=1)
    deadline: int = Field(ge=0)  # chain time


class Heartbeat(Frozen):
    """An agent is alive; it says which leases it is running workers for."""

    running: tuple[int, ...] = Field((), max_length=64)  # lease numbers


class RendezvousPass(Frozen):
    """What a lease's worker shows its job host's gate (`shoal.elastic.gate`): who
    it is, its token, and the SHA-256 of the certificate the gate must show (pinned: the
    gate's certificate is self-signed). Only the lease's provider is told it."""

    identity: str = Field(min_length=1, max_length=64)
    token: str = Field(pattern=r"^[0-9a-f]{64}$")
    cert_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Assignment(Frozen):
    """What an agent must run: a worker for each open lease on its devices."""

    lease: DeviceLease
    job_file: str
    rendezvous: str  # HOST:PORT of the job's host: run the worker with --rendezvous
    # How to pass the host's gate (None: a host that serves without one).
    rendezvous_pass: RendezvousPass | None = None
    ends_at_s: float | None  # a spot notice: leave gracefully by then
    # Where the coordinator settles on a chain: sign these (POST /v1/leases/N/acceptance);
    # None once accepted, or with no chain.
    acceptance: AcceptanceTerms | None = None
    # A bundled job's secret variables (JobSubmission.secret_env), for this lease's worker
    # alone: never written to the provider's disk.
    secret_env: dict[str, str] = {}


class HeartbeatReply(Frozen):
    at_s: float
    assignments: tuple[Assignment, ...] = ()
    stop: tuple[int, ...] = ()  # leases that ended: stop their workers now
    # Files verifiers asked for: send each (PUT /v1/challenges/N/answer) from the proof dir.
    challenges: tuple[ChallengeView, ...] = ()


class Event(Frozen):
    """One entry of the audit log: every state change, who made it, and when."""

    seq: int
    at_s: float
    actor: str  # an address, or "coordinator" for its own decisions
    kind: str
    job_id: str | None = None
    detail: dict[str, object] = Field(default_factory=dict)


class Problem(Frozen):
    """The JSON body of every 4xx answer."""

    detail: str


class ProviderView(Frozen):
    """A provider with its agents and the devices it offers."""

    address: Address
    name: Label
    agents: tuple[AgentView, ...]
    offers: tuple[OfferView, ...]


class Info(Frozen):
    """What a client needs before it signs: whom to sign for, and how often to beat."""

    audience: str
    version: str
    heartbeat_s: float
    max_skew_s: float
