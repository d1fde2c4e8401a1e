"""Auditing what a worker put in a voted step's exchange: the sketch its peers
read from it must be the sketch of what it committed (and, under DiLoCo, the
samples count it sent the one its record claims), and the loss it reported
for the guard must be its samples' loss, as a replay computes it.

The run refuses a step whose declared sketches do not add up to the exchanged
sum (`shoal.verify.sent_check`), so a worker that sent other than it committed
either had the step refused or declared the sketch of what it really sent,
which this check finds. The declarations are read from the step's records as
most of them state them (one writer cannot forge that), never from the
audited worker's own record alone.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import torch

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.verify import sketch as sk
from shoal.verify.sketch import Sketch

Finding = tuple[VerdictKind, str, float | None]


@dataclass(frozen=True)
class Declaration:
    """What a worker declared in a step's exchange, as most of the step's records say."""

    seed: str  # the sum's hash: draws the sketch's directions
    sketch: Sketch
    count: int | None  # under DiLoCo, the samples count it sent
    # The loss it reported to the guard: (sum, samples covered); None where the step's
    # records do not carry loss reports.
    loss: tuple[float | None, int] | None = None


def declared(record: WorkRecord, step_records: list[WorkRecord], tolerance: float
             ) -> Declaration | Finding:
    """What most records of the step (in the record's membership epoch) say its worker
    declared: the sum's seed, its sketch and its count; or the finding if they do not.

    Each record carries what its own worker was told, and the worker may have told its
    peers different things; a row needs a strict majority of the records (within the
    tolerance), so neither a cheat's own record nor a minority of lying peers decides.
    Where only one record of the step was filed, it decides alone: a worker that hides
    its records to poison unseen is judged by its one peer's; but so is a peer that was
    lost, on the word of a cheat (an open trade-off: README, "Proof of learning")."""
    views = [r.exchanged for r in step_records
             if r.step == record.step and r.membership_epoch == record.membership_epoch
             and r.exchanged is not None]
    if not views:
        return (VerdictKind.wrong_params,
                "no record of the step says what its members declared they sent", None)
    def decided(votes: int) -> bool:
        return 2 * votes > len(views)

    seed, votes = collections.Counter(v.seed for v in views).most_common(1)[0]
    if not decided(votes):
        return VerdictKind.unavailable, "the step's records disagree on the exchanged sum", None
    rows = [v for v in views if v.seed == seed and record.rank < len(v.sketches)]
    if not rows:
        return (VerdictKind.wrong_params,
                f"rank {record.rank} declared nothing in the step's exchange", None)
    sketches = [v.sketches[record.rank] for v in rows]
    support = [sum(sk.mismatch(a, b) <= tolerance for b in sketches) for a in sketches]
    best = max(range(len(rows)), key=support.__getitem__)
    counts = collections.Counter(None if v.counts is None else v.counts[record.rank]
                                 for v in rows).most_common(1)[0]
    losses = collections.Counter(_loss_of(v, record.rank) for v in rows).most_common(1)[0]
    if not decided(min(support[best], counts[1], losses[1])):
        return (VerdictKind.unavailable,
                f"the step's records disagree on what rank {record.rank} declared", None)
    return Declaration(seed, sketches[best], counts[0], losses[0])


def _loss_of(view, rank: int) -> tuple[float | None, int] | None:
    if view.losses is None or view.loss_samples is None or rank >= len(view.losses):
        return None
    return view.losses[rank], view.loss_samples[rank]


def declared_distance(record: WorkRecord, step_records: list[WorkRecord],
                      sent: list[torch.Tensor], tolerance: float
                      ) -> tuple[Declaration, float] | Finding:
    """What `record`'s worker declared in the step's exchange (`declared`) and how far its
    sketch is from `sent`'s; or the finding if the step's records do not say."""
    found = declared(record, step_records, tolerance)
    if not isinstance(found, Declaration):
        return found
    return found, sk.mismatch(found.sketch, sk.finite(sk.sketch(found.seed, sent)[0]))


def sent_problem(record: WorkRecord, step_records: list[WorkRecord], sent: list[torch.Tensor],
                 tolerance: float, count: int | None = None) -> Finding | None:
    """None if what `record`'s worker declared it sent is `sent` (its committed
    contribution or pseudo-gradient), within `tolerance`; `count`: under DiLoCo, the
    samples its record says the pseudo-gradient is weighted by."""
    measured = declared_distance(record, step_records, sent, tolerance)
    if not isinstance(measured[0], Declaration):
        return measured
    found, distance = measured
    if distance > tolerance:
        return (VerdictKind.wrong_contribution,
                "what it declared it put in the exchange is not what it committed", distance)
    if count is not None and found.count != count:
        return (VerdictKind.wrong_samples,
                f"sent a samples count of {found.count} beside its pseudo-gradient; "
                f"its record claims {count}", None)
    return None


def loss_problem(record: WorkRecord, step_records: list[WorkRecord], replayed_sum: float,
                 samples: int, tolerance: float) -> Finding | None:
    """None if the loss `record`'s worker reported for the guard (as most of the step's
    records say it declared) is what a replay of its samples gives: `replayed_sum` over
    `samples`, within `tolerance` of its size. A worker may report no loss (a loop
    that does not pass its loss to the run); a report covers all of its samples."""
    found = declared(record, step_records, tolerance)
    if not isinstance(found, Declaration):
        return found
    if found.loss is None:
        return None  # records from before loss reports were declared
    loss, covered = found.loss
    if covered == 0 and loss == 0.0:
        return None
    if covered != samples:
        return (VerdictKind.wrong_loss,
                f"reported a loss over {covered} samples; it computed {samples}", None)
    if loss is None or not math.isfinite(replayed_sum):
        if loss is None and not math.isfinite(replayed_sum):
            return None  # both not finite: a state whose loss overflows, honestly
        return (VerdictKind.wrong_loss, f"reported a loss sum of {loss}; a replay of its "
                f"samples gives {replayed_sum:.6g}", None)
    distance = abs(loss - replayed_sum) / max(abs(replayed_sum), 1e-12)
    if distance > tolerance:
        return (VerdictKind.wrong_loss, f"reported a loss sum of {loss:.6g}; a replay of its "
                f"samples gives {replayed_sum:.6g}", distance)
    return None
