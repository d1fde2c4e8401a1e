"""Proof of learning, the pure parts: Merkle trees of work records, epochs,
structural checks, audit sampling, forced errors, bisection disputes.

Plain Python (no I/O, no clocks): the runtime, the verifier and the
coordinator call it with the records, beacons and times they hold.
"""

from shoal.proof.bisection import Answerer, Bisection, Outcome, Party, losers, play
from shoal.proof.coverage import SHARED_FIELDS, check_step, uncovered
from shoal.proof.epochs import by_epoch, epoch_of, is_complete, missing_steps, steps_of
from shoal.proof.errors import (
    ClockWentBack,
    DisputeClosed,
    DisputeError,
    DuplicateRecord,
    EmptyTree,
    MixedRecords,
    ProofError,
    WrongQuery,
)
from shoal.proof.forced import (
    ForcedErrors,
    PlantScore,
    commitment_of,
    score_verifiers,
    verify_reveal,
    without_plants,
)
from shoal.proof.merkle import MerkleTree, epoch_tree, node_hash, verify_proof
from shoal.proof.sampling import audit_count, audit_rank, audit_sample, beacon, catch_probability
from shoal.proof.verdicts import (
    Disagreement,
    WorkerSummary,
    disagreements,
    guilty_workers,
    summarise,
)

__all__ = [
    "SHARED_FIELDS",
    "Answerer",
    "Bisection",
    "ClockWentBack",
    "Disagreement",
    "DisputeClosed",
    "DisputeError",
    "DuplicateRecord",
    "EmptyTree",
    "ForcedErrors",
    "MerkleTree",
    "MixedRecords",
    "Outcome",
    "Party",
    "PlantScore",
    "ProofError",
    "WorkerSummary",
    "WrongQuery",
    "audit_count",
    "audit_rank",
    "audit_sample",
    "beacon",
    "by_epoch",
    "catch_probability",
    "check_step",
    "commitment_of",
    "disagreements",
    "epoch_of",
    "epoch_tree",
    "guilty_workers",
    "is_complete",
    "losers",
    "missing_steps",
    "node_hash",
    "play",
    "score_verifiers",
    "steps_of",
    "summarise",
    "uncovered",
    "verify_proof",
    "verify_reveal",
    "without_plants",
]
