"""Which records of an epoch to audit: unpredictable to workers, reproducible for anyone.

A record's rank is a keyed hash of the beacon and its own leaf. The beacon
mixes the anchored root with a salt nobody knew when the root was fixed (a
later block hash), so a worker that grinds its record to change the root
still cannot steer the sample, and anyone holding the beacon re-derives it.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Sequence

from shoal.proof.errors import ProofError
from shoal.spec.proof import WorkRecord

_BEACON = b"shoal/proof/beacon\x00"


def beacon(root: bytes, salt: bytes) -> bytes:
    """The audit beacon of an epoch: `salt` must be unknown until `root` is anchored."""
    if len(root) != 32:
        raise ProofError(f"a Merkle root is 32 bytes, got {len(root)}")
    if not salt:
        raise ProofError("an empty salt lets whoever shapes the root predict the sample; "
                         "use a value fixed after the anchor (a later block hash)")
    return hashlib.sha256(_BEACON + root + salt).digest()


def audit_rank(record: WorkRecord, beacon: bytes) -> bytes:
    """A record's place in the audit order: it depends only on the beacon and the record."""
    return hashlib.sha256(beacon + record.leaf()).digest()


def audit_count(rate: float, records: int) -> int:
    """ceil(rate × records), without float noise turning 7.000000000000001 into 8."""
    if not 0.0 <= rate <= 1.0:
        raise ProofError(f"audit rate {rate} is outside [0, 1]")
    return min(records, math.ceil(round(rate * records, 9)))


def audit_sample(records: Sequence[WorkRecord], rate: float, min_per_worker: int,
                 beacon: bytes) -> list[WorkRecord]:
    """The records to audit, in (step, worker) order.

    At least `min_per_worker` of every worker's records (all of them if it has
    fewer), and at least ceil(rate × len(records)) in all: each worker's
    lowest-ranked records first, then the lowest-ranked of the rest. Under
    DiLoCo each of a worker's minimum is a round's end (before its other
    records) and, with it, one of the worker's inner steps (of that round where
    the epoch holds one).
    """
    if min_per_worker < 0:
        raise ProofError(f"min_per_worker is {min_per_worker}; it cannot be negative")
    if len(beacon) < 16:
        raise ProofError("the beacon is too short to be unpredictable; derive it with beacon()")
    ranked = sorted(records, key=lambda r: audit_rank(r, beacon))
    chosen: dict[int, WorkRecord] = {}
    taken: dict[str, int] = defaultdict(int)
    # Under DiLoCo only a round's pseudo-gradient reaches the shared model, and a cheat
    # that poisons it alone keeps every inner step honest: each worker's minimum is
    # drawn from its round-end records first (still in beacon order among them).
    round_ends_first = sorted(range(len(ranked)), key=lambda i: not _round_end(ranked[i]))
    for index in round_ends_first:
        record = ranked[index]
        if taken[record.worker] < min_per_worker:
            taken[record.worker] += 1
            chosen[index] = record
    # The audit of a round's end re-takes the round's optimizer updates on the gradients
    # the worker committed, and replays only its own: a worker that reports noise (or
    # nothing computed) for its inner steps, honest where its rounds end, would pass it
    # while steering its pseudo-gradient. So each round end brings an inner step whose
    # gradient is replayed.
    inner = [i for i in range(len(ranked)) if _inner_step(ranked[i])]  # in beacon order
    for end in [r for r in chosen.values() if _round_end(r)]:
        of_worker = [i for i in inner if i not in chosen and ranked[i].worker == end.worker]
        if of_worker:  # of the end's own round where the epoch holds one
            pick = next((i for i in of_worker
                         if ranked[i].local.round_start == end.local.round_start), of_worker[0])
            chosen[pick] = ranked[pick]
    wanted = audit_count(rate, len(ranked))
    for index, record in enumerate(ranked):
        if len(chosen) >= wanted:
            break
        chosen.setdefault(index, record)
    return sorted(chosen.values(), key=lambda r: (r.step, r.worker))


def _round_end(record: WorkRecord) -> bool:
    return record.local is not None and record.local.outer


def _inner_step(record: WorkRecord) -> bool:
    return record.local is not None and not record.local.outer


def catch_probability(cheat_fraction: float, audits: int) -> float:
    """The chance that `audits` uniform audits of a worker hit at least one of its
    cheating records, when a `cheat_fraction` of its records cheat: 1 − (1 − f)^k."""
    if not 0.0 <= cheat_fraction <= 1.0:
        raise ProofError(f"cheat fraction {cheat_fraction} is outside [0, 1]")
    if audits < 0:
        raise ProofError(f"audits is {audits}; it cannot be negative")
    return 1.0 - (1.0 - cheat_fraction) ** audits
