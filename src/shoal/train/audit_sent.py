"""Auditing what a worker put in a voted step's exchange: the sketch its peers
read from it must be the sketch of what it committed (and, under DiLoCo, the
samples count it sent the one its record claims).

The run refuses a step whose declared sketches do not add up to the exchanged
sum (`shoal.train.sent_check`), so a worker that sent other than it committed
either had the step refused or declared the sketch of what it really sent,
which this check finds. The declarations are read from the step's records as
most of them state them (one writer cannot forge that), never from the
audited worker's own record alone.
"""

from __future__ import annotations

import collections

import torch

from shoal.spec.proof import Exchanged, VerdictKind, WorkRecord
from shoal.train import sketch as sk

Finding = tuple[VerdictKind, str, float | None]


def agreed_exchange(record: WorkRecord, step_records: list[WorkRecord]) -> Exchanged | None:
    """What most records of the step (in the record's membership epoch) say its members
    declared; None if none says."""
    views = collections.Counter(
        r.exchanged for r in step_records
        if r.step == record.step and r.membership_epoch == record.membership_epoch
        and r.exchanged is not None)
    return views.most_common(1)[0][0] if views else None


def sent_problem(record: WorkRecord, step_records: list[WorkRecord], sent: list[torch.Tensor],
                 tolerance: float, count: int | None = None) -> Finding | None:
    """None if what `record`'s worker declared it sent is `sent` (its committed
    contribution or pseudo-gradient), within `tolerance`; `count`: under DiLoCo, the
    samples its record says the pseudo-gradient is weighted by."""
    view = agreed_exchange(record, step_records)
    if view is None:
        return (VerdictKind.wrong_params,
                "no record of the step says what its members declared they sent", None)
    if record.rank >= len(view.sketches):
        return (VerdictKind.wrong_params,
                f"rank {record.rank} declared nothing in the step's exchange", None)
    declared = view.sketches[record.rank]
    distance = sk.mismatch(declared, sk.finite(sk.sketch(view.seed, sent)[0]))
    if distance > tolerance:
        return (VerdictKind.wrong_contribution,
                "what it declared it put in the exchange is not what it committed", distance)
    if count is not None and (view.counts is None or view.counts[record.rank] != count):
        sent_count = None if view.counts is None else view.counts[record.rank]
        return (VerdictKind.wrong_samples,
                f"sent a samples count of {sent_count} beside its pseudo-gradient; "
                f"its record claims {count}", None)
    return None
