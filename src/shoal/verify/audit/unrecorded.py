"""Auditing a share of a voted step that its worker filed no record for.

A worker can put a poisoned part in a step's all-reduce, declare its sketch
so the sums add up and the step is applied, and then file no record of the
step (or file it under a membership epoch the step's final lineage does not
take). No record means no commitment to open, but its peers' records still
say what it declared it sent. The share is replayed from the step's agreed
parameters on the samples its rank had to read (the step's split names
them), and the declaration must be the sketch of that replay: an honest
worker whose machine vanished before it filed matches; a poisoner does not.
The worker is named by the job's published membership (rank order).

Under DiLoCo a round's pseudo-gradient is the end of the worker's own inner
steps: `shoal.verify.audit.unrecorded_round` replays the round from the states
the worker kept.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.verify.audit.sent import Declaration, Finding, declared_distance, loss_problem
from shoal.train.order import share_positions, step_cursor
from shoal.verify.work_records import step_rng_seed

# membership epoch -> its members in rank order, as the job's host published them
# (None where it is not known).
Members = Callable[[int], Sequence[str] | None]

UNRECORDED = "filed no record of the step"


@dataclass(frozen=True)
class Unrecorded:
    """A rank that had samples in a voted step and filed no record in its final lineage."""

    step: int
    rank: int
    membership_epoch: int
    worker: str | None  # from the published membership; None where it is not known


def unrecorded_shares(step_records: Sequence[WorkRecord], members: Members) -> list[Unrecorded]:
    """The ranks of one step's final lineage (`step_records`) that had a share, declared
    a part in the step's exchange, and filed no record. Under DiLoCo the step is a
    round's end, and every member sent its round's work (judged by
    `shoal.verify.audit.unrecorded_round`)."""
    if not step_records:
        return []
    first = step_records[0]
    voted = [r for r in step_records if r.exchanged is not None]
    if 2 * len(voted) <= len(step_records):
        return []  # no exchange to read declarations from
    shares = collections.Counter(r.shares for r in step_records).most_common(1)[0][0]
    filed = {r.rank for r in step_records if r.shares == shares}
    seats = members(first.membership_epoch)
    if seats is not None and len(seats) != len(shares):
        seats = None  # a membership of another size is not the one the step ran in
    return [Unrecorded(first.step, rank, first.membership_epoch,
                       seats[rank] if seats is not None else None)
            for rank, share in enumerate(shares)
            # A DiLoCo member sends its round's work even with no sample at the last step.
            if (share > 0 or first.local is not None) and rank not in filed]


def stand_in(share: Unrecorded, step_records: Sequence[WorkRecord]) -> WorkRecord:
    """The record an honest worker of `share` would have filed, but for what it committed:
    the step's common fields (as most of its records state them) and the rank's slice.
    Only to replay from; its commitment fields are placeholders nobody opens."""
    common = ("params_sha256", "shares", "seed", "global_batch", "micro_batch",
              "hyper_sha256", "job")
    template = collections.Counter(tuple(getattr(r, f) for f in common)
                                   for r in step_records).most_common(1)[0][0]
    fields = dict(zip(common, template))
    positions = share_positions(step_cursor(share.step, fields["global_batch"]),
                                fields["shares"], share.rank)
    return WorkRecord(**fields, step=share.step, worker=share.worker or f"rank-{share.rank}",
                      rank=share.rank, positions_start=positions.start,
                      positions_end=positions.stop,
                      rng_seed=step_rng_seed(fields["seed"], share.step, positions.start),
                      membership_epoch=share.membership_epoch,
                      contribution_sha256="0" * 64, contribution_norm=None)


def judge_unrecorded(record: WorkRecord, step_records: Sequence[WorkRecord],
                     replayed: list, loss_sum: float, loss_samples: int,
                     tolerance: float) -> Finding:
    """The finding on a share with no record (`record`: its `stand_in`), from a replay of
    it from the step's agreed parameters: valid when what its worker declared in the
    exchange is the replay's sketch and the loss it reported the replay's loss."""
    measured = declared_distance(record, list(step_records), replayed, tolerance)
    if not isinstance(measured[0], Declaration):
        # Its peers' records disagree: they, not the worker without a record, are at
        # fault, and which declaration was its cannot be told.
        return VerdictKind.unavailable, f"{UNRECORDED}; {measured[1]}", None
    distance = measured[1]
    if distance > tolerance:
        return (VerdictKind.wrong_contribution, f"{UNRECORDED}; what it declared it put in the "
                "exchange is not the gradient of its samples", distance)
    lied = loss_problem(record, list(step_records), loss_sum, loss_samples, tolerance)
    if lied is not None:
        return lied[0], f"{UNRECORDED}; {lied[1]}", lied[2]
    return (VerdictKind.valid, f"{UNRECORDED}; what it declared is the gradient of its "
            "samples (a worker lost before it filed)", distance)
