"""The coordinator's tables: participants, agents, offers, jobs, leases, the
market's command journal, the audit log, and the nonces that stop replays.

Money is integer wei kept as decimal text: SQLite would round a large
NUMERIC to a float, and a wei lost to rounding is money lost.
"""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class Wei(TypeDecorator[int]):
    """An integer of any size, stored as its decimal digits."""

    impl = String(80)
    cache_ok = True

    def process_bind_param(self, value: int | None, dialect: object) -> str | None:
        return None if value is None else str(int(value))

    def process_result_value(self, value: str | None, dialect: object) -> int | None:
        return None if value is None else int(value)


class Base(DeclarativeBase):
    pass


class ParticipantRow(Base):
    __tablename__ = "participants"
    address: Mapped[str] = mapped_column(String(42), primary_key=True)  # checksummed
    role: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(64))
    registered_at_s: Mapped[float] = mapped_column(Float)
    # The highest priority its jobs may take: 0 unless an operator granted more.
    max_priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class NonceRow(Base):
    """A nonce seen from an address; kept for the skew window, then pruned."""

    __tablename__ = "nonces"
    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    seen_at_s: Mapped[float] = mapped_column(Float, index=True)


class AgentRow(Base):
    __tablename__ = "agents"
    agent_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    provider: Mapped[str] = mapped_column(ForeignKey("participants.address"), index=True)
    region: Mapped[str] = mapped_column(String(128))
    devices: Mapped[list] = mapped_column(JSON)  # Preflight values, as measured
    registered_at_s: Mapped[float] = mapped_column(Float)
    last_seen_s: Mapped[float] = mapped_column(Float)
    running: Mapped[list] = mapped_column(JSON, default=list)  # lease numbers, as last reported


class OfferRow(Base):
    __tablename__ = "offers"
    offer_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    provider: Mapped[str] = mapped_column(ForeignKey("participants.address"), index=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.agent_id"), index=True)
    device: Mapped[int] = mapped_column(Integer)
    device_kind: Mapped[str] = mapped_column(String(128))
    region: Mapped[str] = mapped_column(String(128))
    speed_samples_per_s: Mapped[float] = mapped_column(Float)
    memory_gb: Mapped[float] = mapped_column(Float)
    price_wei_per_s: Mapped[int] = mapped_column(Wei)
    tenancy: Mapped[str] = mapped_column(String(16))
    reference_wei_per_s: Mapped[int | None] = mapped_column(Wei, nullable=True)
    withdrawn: Mapped[bool] = mapped_column(Boolean, default=False)
    marked_down: Mapped[bool] = mapped_column(Boolean, default=False)


class JobRow(Base):
    __tablename__ = "jobs"
    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    submitter: Mapped[str] = mapped_column(ForeignKey("participants.address"), index=True)
    job_file: Mapped[str] = mapped_column(Text)
    bid: Mapped[dict] = mapped_column(JSON)  # the market Bid, budget as first escrowed
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at_s: Mapped[float] = mapped_column(Float)
    # The job host serving its rendezvous (HOST:PORT) and its pid, once started.
    rendezvous: Mapped[str | None] = mapped_column(String(128), nullable=True)
    host_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    chain_job: Mapped[int | None] = mapped_column(Integer, nullable=True)  # its escrow on chain
    # When the coordinator recorded its host serving at `rendezvous`: the newest endpoint's.
    rendezvous_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    plan: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # the latest JobPlanView


class ChainLeaseRow(Base):
    """A provider's lease on a job's chain escrow, opened from its signed acceptance."""

    __tablename__ = "chain_leases"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True)
    provider: Mapped[str] = mapped_column(String(42), primary_key=True)
    price_wei_per_s: Mapped[int] = mapped_column(Wei)
    term_s: Mapped[int] = mapped_column(Integer)
    accepted_at: Mapped[int] = mapped_column(Integer)  # chain time


class LeaseRow(Base):
    """A device lease as the market made it; `ends_at_s` is set when it ends."""

    __tablename__ = "leases"
    lease: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    offer_id: Mapped[str] = mapped_column(ForeignKey("offers.offer_id"), index=True)
    provider: Mapped[str] = mapped_column(String(42), index=True)
    price_wei_per_s: Mapped[int] = mapped_column(Wei)
    start_s: Mapped[float] = mapped_column(Float)
    ends_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    value: Mapped[dict] = mapped_column(JSON)  # the DeviceLease, as last known
    # When its agent last stored new work records of the job (None: never).
    records_stored_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class SettlementRow(Base):
    """A chain job's settlement as tried: failed tries back off, and a job settled (or
    found closed on chain) is never tried again."""

    __tablename__ = "settlements"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    failed_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # the last failure
    settled_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class MarketCommandRow(Base):
    """One call that changed the market, in order: replayed, they rebuild it exactly."""

    __tablename__ = "market_commands"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at_s: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict] = mapped_column(JSON)


class EventRow(Base):
    """The audit log: every state change, by whom, when. Only ever served, never read
    back as state: what the coordinator needs to remember lives in its own columns."""

    __tablename__ = "events"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at_s: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(42))
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[dict] = mapped_column(JSON)

    __table_args__ = (Index("ix_events_job_seq", "job_id", "seq"),)


class WorkRecordRow(Base):
    """A work record an agent uploaded: a commitment, never replaced once stored."""

    __tablename__ = "work_records"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True)
    worker: Mapped[str] = mapped_column(String(128), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    lease: Mapped[int] = mapped_column(Integer, index=True)
    provider: Mapped[str] = mapped_column(String(42))
    agent_id: Mapped[str] = mapped_column(String(64))
    body: Mapped[dict] = mapped_column(JSON)  # the WorkRecord


class ProofEpochRow(Base):
    """A proof epoch's root, fixed once, and where it was anchored on chain."""

    __tablename__ = "proof_epochs"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    root: Mapped[str] = mapped_column(String(66))
    records: Mapped[int] = mapped_column(Integer)
    complete: Mapped[bool] = mapped_column(Boolean)
    rooted_at_s: Mapped[float] = mapped_column(Float)
    chain_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    anchored_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    anchor_tx: Mapped[str | None] = mapped_column(String(66), nullable=True)
    # What went on chain: the root, or with forced errors served, the root sealed with a
    # salt revealed after the job (shoal.proof.forced.sealed_root).
    anchored_root: Mapped[str | None] = mapped_column(String(66), nullable=True)


class ChallengeRow(Base):
    """A verifier's request for a file only a worker's agent holds."""

    __tablename__ = "challenges"
    challenge: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    worker: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    agent_id: Mapped[str] = mapped_column(String(64), index=True)
    requested_by: Mapped[str] = mapped_column(String(42))
    requested_at_s: Mapped[float] = mapped_column(Float)
    answered_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # When its file was deleted (proofs/retention.py); its hash stays, the file is gone.
    pruned_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (Index("ix_challenges_target", "job_id", "worker", "step", "kind", unique=True),)


class VerdictRow(Base):
    """A signed verdict a verifier filed, and the referee's ruling on a guilty one."""

    __tablename__ = "verdicts"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    at_s: Mapped[float] = mapped_column(Float)
    verifier: Mapped[str] = mapped_column(String(42))
    worker: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    body: Mapped[dict] = mapped_column(JSON)  # the SignedVerdictBody
    ruling: Mapped[str | None] = mapped_column(String(16), nullable=True)


class StepProgressRow(Base):
    """A committed step's loss and pace, as the agent of its rank 0 reported it."""

    __tablename__ = "step_progress"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    t: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    world: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str] = mapped_column(String(128))


class ForcedPlanRow(Base):
    """A job's forced errors: the operator's secret, committed to (sha256) when the plan
    is made and revealed once the job's audits are over."""

    __tablename__ = "forced_plans"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True)
    secret: Mapped[str] = mapped_column(String(64))  # hex; served to nobody before the reveal
    commitment: Mapped[str] = mapped_column(String(64))
    rate: Mapped[float] = mapped_column(Float)
    committed_at_s: Mapped[float] = mapped_column(Float)
    revealed_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class PlantRow(Base):
    """A record the plan marked as planted: its reveal fetched from the worker's agent,
    then served to verifiers scaled and re-committed ("ready"), or served as it is
    ("dropped") when the file did not come in time or did not open the commitment."""

    __tablename__ = "plants"
    plant: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(Integer)
    agent_id: Mapped[str] = mapped_column(String(64))
    requested_at_s: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16))  # fetching, ready, dropped
    body: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # the record as served
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)  # of the served file

    __table_args__ = (Index("ix_plants_target", "job_id", "worker", "step", unique=True),)


class ServedEpochRow(Base):
    """A rooted proof epoch as verifiers see it (plants in): published a fixed wait after
    it was scheduled, whatever it holds, so the wait tells nothing."""

    __tablename__ = "served_epochs"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    scheduled_at_s: Mapped[float] = mapped_column(Float)
    published_at_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    root: Mapped[str | None] = mapped_column(String(66), nullable=True)  # of the served tree


class DisputeRow(Base):
    """A dispute a challenger opened on the contract and brought here with its trajectory
    over one worker's proof epoch; the bisection's end and the referee's ruling."""

    __tablename__ = "disputes"
    dispute: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # chain id
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    worker: Mapped[str] = mapped_column(String(128))
    epoch: Mapped[int] = mapped_column(Integer)
    challenger: Mapped[str] = mapped_column(String(42))
    provider: Mapped[str] = mapped_column(String(42))
    filed_at_s: Mapped[float] = mapped_column(Float)
    trajectory: Mapped[list] = mapped_column(JSON)  # the challenger's states, as filed
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rounds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ruling: Mapped[str | None] = mapped_column(String(16), nullable=True)
    why: Mapped[str] = mapped_column(Text, default="")
    tx: Mapped[str | None] = mapped_column(String(66), nullable=True)
    chain_state: Mapped[str | None] = mapped_column(String(16), nullable=True)  # once final
