"""Which samples and seeds a record may state: the seeds are the job's (never the
worker's choice), and its positions its rank's slice of the split its step's
records agree on. Shared by the audit of a record and, under DiLoCo, the audit
of a round's end, which vouches for every earlier step of its round."""

from __future__ import annotations

import collections

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.verify.audit.sent import Finding
from shoal.train.order import share_positions, step_cursor
from shoal.verify.replay import JobSeeds
from shoal.verify.work_records import step_rng_seed


def seeds_problem(record: WorkRecord, seeds: JobSeeds | None) -> str:
    """Why the record's seeds are not the ones the job fixes, or "". A worker that picks
    its data seed picks its samples (and, stating it first in a step of two, would make
    its honest peer the odd one out); one that picks its RNG seed may grind dropout masks
    for the most harmful update that still replays exactly."""
    if seeds is not None and record.seed != seeds.seed:
        return f"its data seed {record.seed} is not the job's"
    if seeds is not None and record.micro_batch != seeds.micro_batch:
        return f"its micro-batch of {record.micro_batch} is not the job's {seeds.micro_batch}"
    if record.rng_seed != step_rng_seed(record.seed, record.step, record.positions_start):
        return "its RNG seed is not the one the job derives for its step and slice"
    return ""


def slice_problem(record: WorkRecord, step_records: list[WorkRecord],
                  seeds: JobSeeds | None) -> Finding | None:
    """Why the record's samples are not its rank's slice of its step, or None;
    `step_records`: the step's (those without the job's `seeds` are wrong on their own
    and have no say in their peers' split).

    The split (shares) must be the one most of the step's records state, and the
    positions exactly the rank's part of it: copying another worker's slice, or
    moving to samples of another step, cannot pass. Where as many records state
    another split as this one's, nobody can tell which is the step's: no verdict (a
    record listed first must not make its peer the odd one out). Two records
    claiming one rank are left to the commitment and the replay (a copied commitment
    cannot be opened under another worker's name)."""
    split = collections.Counter((r.shares, r.global_batch, r.seed) for r in step_records
                                if not seeds_problem(r, seeds))
    mine = (record.shares, record.global_batch, record.seed)
    top = max(split.values(), default=0)
    if split.get(mine, 0) < top:
        return VerdictKind.wrong_samples, "its split of the step's batch differs from its peers'", None
    if sum(count == top for count in split.values()) > 1:
        return (VerdictKind.unavailable, "the step's records disagree on its split of the "
                "batch, as many for one as for another", None)
    if record.rank >= len(record.shares) or sum(record.shares) != record.global_batch:
        return (VerdictKind.wrong_samples,
                f"rank {record.rank} has no slice in a split of {len(record.shares)}", None)
    expected = share_positions(step_cursor(record.step, record.global_batch), record.shares,
                               record.rank)
    if (record.positions_start, record.positions_end) != (expected.start, expected.stop):
        return (VerdictKind.wrong_samples,
                f"positions [{record.positions_start}, {record.positions_end}) are not rank "
                f"{record.rank}'s slice [{expected.start}, {expected.stop})", None)
    return None
