"""The shared vocabulary: frozen, validated values that cross layers.

No behaviour beyond validation; imports nothing heavier than pydantic.
"""

from shoal.spec.errors import SpecError
from shoal.spec.job import (
    BYTE_VOCAB,
    Aggregation,
    CheckpointSpec,
    DataSpec,
    JobSpec,
    ModelSpec,
    OptimizerKind,
    Precision,
    OptimizerSpec,
    ScheduleKind,
    ScheduleSpec,
)
from shoal.spec.jobfile import load_job, parse_job
from shoal.spec.proof import ProofSpec, Verdict, VerdictKind, WorkRecord, hyper_digest
from shoal.spec.ledger import (
    Anchor,
    ChainEvent,
    Dispute,
    DisputeState,
    JobEscrow,
    JobState,
    Lease,
    LedgerConfig,
    Stake,
    TxOutcome,
)
from shoal.spec.market import (
    Bid,
    DeviceLease,
    FillStatus,
    JobFill,
    Offer,
    PreemptionNotice,
    PriceTable,
    ReferencePrice,
    Tenancy,
)
from shoal.spec.report import TrainReport

__all__ = [
    "Bid",
    "DeviceLease",
    "FillStatus",
    "JobFill",
    "Offer",
    "PreemptionNotice",
    "PriceTable",
    "ReferencePrice",
    "Tenancy",
    "Anchor",
    "ChainEvent",
    "Dispute",
    "DisputeState",
    "JobEscrow",
    "JobState",
    "Lease",
    "LedgerConfig",
    "Stake",
    "TxOutcome",
    "BYTE_VOCAB",
    "Aggregation",
    "ProofSpec",
    "Verdict",
    "VerdictKind",
    "WorkRecord",
    "hyper_digest",
    "CheckpointSpec",
    "DataSpec",
    "JobSpec",
    "ModelSpec",
    "OptimizerKind",
    "Precision",
    "OptimizerSpec",
    "ScheduleKind",
    "ScheduleSpec",
    "SpecError",
    "TrainReport",
    "load_job",
    "parse_job",
]
