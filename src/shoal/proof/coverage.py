"""The structural check of one step's records, before any replay.

Under the invariant batch policy step s reads stream positions
[s*G, (s+1)*G), G the global batch, split in rank order by the step's
shares; a record off its rank's slice, one that reuses another's samples,
or one that started from other parameters or settings than its peers is
named here, cheaply, so that it is audited.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from shoal.proof.errors import MixedRecords
from shoal.spec.proof import WorkRecord

# The values every record of a step must share: a step has one global batch and
# split of it, one data seed, one set of hyperparameters and one starting point.
SHARED_FIELDS = ("global_batch", "shares", "seed", "hyper_sha256", "params_sha256")


def check_step(records: Sequence[WorkRecord], reference: Mapping[str, object] | None = None,
               ranks: Mapping[str, int] | None = None) -> dict[str, str]:
    """Workers whose records of one step are structurally wrong, with the reasons.

    `reference` holds the job's own values of some `SHARED_FIELDS` (the hyper
    digest, the snapshot's parameter hash) where the caller has them; those
    fields are judged against it, the others against the majority of the step.
    Two records on one slice are both named, since the records alone cannot
    tell the copier from the copied; with `ranks` (each worker's rank in the
    step's membership) a record under another rank is named and its victim not.
    """
    if not records:
        return {}
    if len({(r.job, r.step) for r in records}) > 1:
        raise MixedRecords("check_step judges the records of one step of one job at a time")
    reasons: dict[str, list[str]] = defaultdict(list)
    for worker, n in Counter(r.worker for r in records).items():
        if n > 1:
            reasons[worker].append(f"{n} records for step {records[0].step}")
    placed = []
    for record in records:
        problem = _positions_problem(record) or _rank_problem(record, ranks)
        if problem:
            reasons[record.worker].append(problem)
        elif record.samples > 0:
            placed.append(record)
    # Only records that sit on their own slice are compared: one already named
    # would otherwise drag in the honest owner of its samples. With `ranks`, two
    # records on one slice cannot both hold its rank, so one is named above.
    if ranks is None:
        for worker, problem in _overlaps(placed):
            reasons[worker].append(problem)
    for worker, problem in _disagreements(records, reference or {}):
        reasons[worker].append(problem)
    return {worker: "; ".join(found) for worker, found in sorted(reasons.items())}


def rank_slice(record: WorkRecord) -> tuple[int, int] | None:
    """The positions [start, end) the record's rank reads under its stated split,
    or None when the rank is not in the split."""
    if record.rank >= len(record.shares):
        return None
    start = record.step * record.global_batch + sum(record.shares[:record.rank])
    return start, start + record.shares[record.rank]


def _positions_problem(record: WorkRecord) -> str:
    start, end = record.positions_start, record.positions_end
    window = (record.step * record.global_batch, (record.step + 1) * record.global_batch)
    if end < start:
        return f"positions [{start}, {end}) run backwards"
    if end > start and (start < window[0] or end > window[1]):
        return f"positions [{start}, {end}) outside step {record.step}'s [{window[0]}, {window[1]})"
    if sum(record.shares) != record.global_batch:
        return f"shares sum to {sum(record.shares)}, not the global batch {record.global_batch}"
    expected = rank_slice(record)
    if expected is None:
        return f"rank {record.rank} is not in a split of {len(record.shares)} shares"
    if (start, end) != expected:
        return (f"positions [{start}, {end}) are not rank {record.rank}'s slice "
                f"[{expected[0]}, {expected[1]})")
    if end == start and record.contributed:
        # An empty share is honest (more workers than samples) only if it adds nothing.
        return "no samples but a non-zero contribution"
    return ""


def _rank_problem(record: WorkRecord, ranks: Mapping[str, int] | None) -> str:
    if ranks is None or ranks.get(record.worker) == record.rank:
        return ""
    if record.worker not in ranks:
        return "the worker had no rank in this step's membership"
    return f"claims rank {record.rank}, but held rank {ranks[record.worker]}"


def _overlaps(records: Sequence[WorkRecord]) -> list[tuple[str, str]]:
    """Both records of every pair that reads a sample twice."""
    spans = sorted((r.positions_start, r.positions_end, r.worker) for r in records)
    found = []
    for i, (start, end, worker) in enumerate(spans):
        for other_start, other_end, other in spans[i + 1:]:
            if other_start >= end:
                break  # sorted by start: no later span reaches back into this one
            both = f"[{max(start, other_start)}, {min(end, other_end)})"
            found.append((worker, f"positions {both} also claimed by '{other}'"))
            found.append((other, f"positions {both} also claimed by '{worker}'"))
    return found


def _disagreements(records: Sequence[WorkRecord],
                   reference: Mapping[str, object]) -> list[tuple[str, str]]:
    found = []
    for field in SHARED_FIELDS:
        values = Counter(getattr(r, field) for r in records)
        expected, source = reference.get(field), "the job's"
        if field not in reference:
            (expected, top), *rest = values.most_common()
            source = "the step's majority"
            if rest and rest[0][1] == top:
                # A tie has no majority to trust: every side is named, and the
                # caller settles it against the job's own values (`reference`).
                found += [(r.worker, f"{field} is split evenly across the step; no majority")
                          for r in records]
                continue
        found += [(r.worker, f"{field} {getattr(r, field)!r} differs from {source} {expected!r}")
                  for r in records if getattr(r, field) != expected]
    return found


def uncovered(records: Sequence[WorkRecord], step: int, global_batch: int) -> list[tuple[int, int]]:
    """The ranges of step `step`'s window that no record reads (samples nobody trained on)."""
    cursor, end = step * global_batch, (step + 1) * global_batch
    gaps = []
    for r in sorted(records, key=lambda r: r.positions_start):
        if r.positions_start > cursor:
            gaps.append((cursor, min(r.positions_start, end)))
        cursor = max(cursor, r.positions_end)
        if cursor >= end:
            break
    if cursor < end:
        gaps.append((cursor, end))
    return [(a, b) for a, b in gaps if a < b]
