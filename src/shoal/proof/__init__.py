"""Proof of learning, the pure parts: Merkle trees of work records, epochs,
structural checks, audit sampling, forced errors, bisection disputes.

Plain Python (no I/O, no clocks): the runtime, the verifier and the
coordinator call it with the records, beacons and times they hold.
"""

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
from shoal.proof.merkle import MerkleTree, epoch_tree, node_hash, verify_proof

__all__ = [
    "SHARED_FIELDS",
    "ClockWentBack",
    "DisputeClosed",
    "DisputeError",
    "DuplicateRecord",
    "EmptyTree",
    "MerkleTree",
    "MixedRecords",
    "ProofError",
    "WrongQuery",
    "by_epoch",
    "check_step",
    "epoch_of",
    "epoch_tree",
    "is_complete",
    "missing_steps",
    "node_hash",
    "steps_of",
    "uncovered",
    "verify_proof",
]
