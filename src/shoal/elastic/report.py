"""The report of an elastic run, read from what the run left on disk: every
worker's step log, the authority's epochs and the launcher's fault times.

Coverage is checked on the final lineage (for each step, the record of the
newest epoch that committed it): the union of its shares must tile the
sample stream with no gap and no overlap.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from shoal import jsonl
from shoal.spec.elastic import ElasticReport, FaultKind, FaultReport, StepRecord
from shoal.elastic.recovery import recovery_s
from shoal.train.step_log import read_step_logs


@dataclass(frozen=True)
class FaultEvent:
    kind: FaultKind
    worker: str
    t: float  # wall time the launcher injected it


def lineage(records: list[StepRecord]) -> list[StepRecord]:
    """One record per step: the lowest rank of the newest epoch that committed it."""
    best: dict[int, StepRecord] = {}
    for r in records:
        kept = best.get(r.step)
        if kept is None or (r.epoch, -r.rank) > (kept.epoch, -kept.rank):
            best[r.step] = r
    return [best[s] for s in sorted(best)]


def coverage(steps: list[StepRecord]) -> tuple[int, int, int]:
    """(seen, skipped, duplicated) sample positions over the lineage, from its first step."""
    intervals = sorted((r.cursor, r.cursor + sum(r.shares)) for r in steps)
    seen = skipped = duplicated = 0
    reach = intervals[0][0] if intervals else 0  # a resumed run starts at its checkpoint's cursor
    for start, end in intervals:
        if start > reach:
            skipped += start - reach
        duplicated += max(0, min(end, reach) - start)
        seen += max(0, end - max(start, reach))
        reach = max(reach, end)
    return seen, skipped, duplicated


def replica_agreement(records: list[StepRecord]) -> tuple[int, int]:
    """(checks, mismatches): steps where live replicas hashed their parameters."""
    hashes: dict[tuple[int, int], set[str]] = defaultdict(set)
    for r in records:
        if r.param_sha256:
            hashes[(r.epoch, r.step)].add(r.param_sha256)
    return len(hashes), sum(1 for found in hashes.values() if len(found) > 1)


def _epochs(run_dir: Path) -> list[dict]:
    lines, _ = jsonl.read(run_dir / "epochs.jsonl")  # the host may be writing its last line
    return [json.loads(line) for line in lines]


def _fault_report(fault: FaultEvent, epochs: list[dict], steps: list[StepRecord],
                  all_records: list[StepRecord], started: float) -> FaultReport:
    spans = [(r.t_start, r.t_commit) for r in steps]
    noticed = [e["t"] for e in epochs if e["t"] >= fault.t and fault.worker in e["reason"]]
    if fault.kind is FaultKind.join:
        noticed = [e["t"] for e in epochs if e["t"] >= fault.t and fault.worker in e["members"]]
    redone = redone_steps(all_records, fault.t)
    return FaultReport(
        kind=fault.kind, worker=fault.worker, t=round(fault.t - started, 3),
        detection_s=round(noticed[0] - fault.t, 4) if noticed else None,
        recovery_s=_round(recovery_s(spans, fault.t)) if fault.kind is not FaultKind.join else None,
        steps_lost=len(redone),
    )


def redone_steps(records: list[StepRecord], fault_t: float) -> set[int]:
    """Steps lost to a fault at `fault_t`: committed before it and committed again, in a
    later epoch, after it (state went back to a checkpoint). Replicas commit the same step
    a few ms apart, so records of the same epoch never count as a redo."""
    epoch_before: dict[int, int] = {}
    for r in records:
        if r.t_commit <= fault_t:
            epoch_before[r.step] = max(r.epoch, epoch_before.get(r.step, -1))
    return {r.step for r in records
            if r.t_commit > fault_t and r.epoch > epoch_before.get(r.step, r.epoch)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def eta_het(steps: list[StepRecord], speeds: dict[str, float]) -> float | None:
    """Achieved samples/s in the last epoch over the sum of its members' own speeds."""
    if not steps or not speeds:
        return None
    last = [r for r in steps if r.epoch == steps[-1].epoch]
    if len(last) < 3:
        return None
    durations = [b.t_commit - a.t_commit for a, b in zip(last, last[1:])]
    achieved = sum(last[-1].shares) / statistics.median(durations)
    total = sum(speeds.values())
    return round(achieved / total, 4) if total > 0 else None


def _published(final: dict) -> dict[str, object]:
    """The program's own figures from the job's final word (not the runtime's)."""
    return {str(k)[:64]: v for k, v in list(final.items())[:64]
            if k not in ("steps", "param_sha256")
            and (v is None or isinstance(v, (int, float, str, bool)))}


def build_report(run_dir: Path, faults: list[FaultEvent], started: float,
                 final: dict, speeds: dict[str, float] | None = None) -> ElasticReport:
    records = read_step_logs(run_dir)
    steps = lineage(records)
    seen, skipped, duplicated = coverage(steps)
    checks, mismatches = replica_agreement(records)
    epochs = _epochs(run_dir)
    elapsed = (steps[-1].t_commit - steps[0].t_start) if steps else 0.0
    applied = [r.loss for r in steps if r.applied and r.loss is not None]
    return ElasticReport(
        steps=len(steps),
        faults=tuple(_fault_report(f, epochs, steps, records, started) for f in faults),
        epochs=len(epochs),
        samples_seen=seen,
        samples_skipped=skipped,
        samples_duplicated=duplicated,
        guard_skipped_steps=sum(1 for r in steps if not r.applied),
        replica_mismatches=mismatches,
        replica_checks=checks,
        throughput_samples_per_s=round(seen / elapsed, 3) if elapsed > 0 else 0.0,
        eta_het=eta_het(steps, speeds or {}),
        wall_s=round(max((r.t_commit for r in records), default=started) - started, 3),
        param_sha256=final.get("param_sha256"),
        train_loss=statistics.fmean(applied[-20:]) if applied else None,
        val_loss=final.get("val_loss"),
        published=_published(final),
        samples_dropped=sum(r.samples_dropped for r in steps),
        slt_seen=max((r.slt_seen for r in steps if r.slt_seen), default=None),
        rounds_late=sum(r.rounds_late for r in steps),
        rounds_dropped=sum(r.rounds_dropped for r in steps),
    )
