"""Work records and verdicts for the proof tests: an honest step by default."""

from __future__ import annotations

import hashlib

from shoal.spec.proof import Verdict, VerdictKind, WorkRecord

JOB = "job-1"
GLOBAL_BATCH = 8


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def record(step: int, worker: str, start: int | None = None, end: int | None = None,
           **changes: object) -> WorkRecord:
    """`worker`'s record of `step`; by default rank 0 of one, reading the whole window."""
    start = step * GLOBAL_BATCH if start is None else start
    end = (step + 1) * GLOBAL_BATCH if end is None else end
    values = dict(job=JOB, step=step, worker=worker, params_sha256=digest(f"params@{step}"),
                  positions_start=start, positions_end=end, rank=0, shares=(GLOBAL_BATCH,),
                  seed=7, global_batch=GLOBAL_BATCH,
                  hyper_sha256=digest("hyper"), contribution_sha256=digest(f"{worker}@{step}"),
                  contribution_norm=1.0, rng_seed=step)
    values.update(changes)
    return WorkRecord(**values)


def honest_step(step: int, shares: list[int]) -> list[WorkRecord]:
    """One step tiled by workers w0, w1, … taking `shares` samples each (sum = global batch)."""
    out, cursor = [], step * GLOBAL_BATCH
    for i, share in enumerate(shares):
        out.append(record(step, f"w{i}", cursor, cursor + share, rank=i, shares=tuple(shares),
                          contribution_norm=1.0 if share else 0.0))
        cursor += share
    return out


def honest_epoch(steps: range, workers: int = 4) -> list[WorkRecord]:
    share = GLOBAL_BATCH // workers
    return [r for s in steps for r in honest_step(s, [share] * workers)]


def verdict(r: WorkRecord, kind: VerdictKind, verifier: str = "v", epoch: int = 0) -> Verdict:
    return Verdict(job=r.job, epoch=epoch, step=r.step, worker=r.worker, kind=kind,
                   verifier=verifier)
