"""Churn benchmark: a worker killed every 15 s (rotating over ranks, rank 0
first) and a replacement called in from a warm spare, for shoal and for
torchft on the same schedule in the same run. Efficiency is the useful
samples/s while the faults go on over what the same system gives fault-free
with the full world (measured in the same run): the capacity lost to the
dead worker counts against it, as it does for the job.

    .venv/bin/python -m bench.churn [--workers 3] [--interval-s 15] [--duration-s 180]

Prints progress to stderr and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from bench.fault_plan import Applied, Fault, FaultPlan
from bench.figures import Commit, figures_of, median, progress
from bench.shoal_side import run_shoal, samples_per_s, shoal_detection, shoal_under_plan, steps_per_s
from bench.history import RECORD_HELP, append_result

JOB = "bench/elastic-gpt.toml"
WARMUP = 20


def log(message: str) -> None:
    print(f"[bench.churn] {message}", file=sys.stderr, flush=True)


def useful_rate(commits: Sequence[Commit], start_t: float, end_t: float, batch: int) -> float:
    """Samples/s of the steps that advanced the job between start_t and end_t."""
    advanced = sum(1 for c in progress(commits) if start_t < c.t_commit <= end_t)
    return advanced * batch / (end_t - start_t)


def steady_rate(commits: Sequence[Commit], batch: int, skip: int = WARMUP) -> float:
    line = progress(commits)[skip:]
    return (len(line) - 1) * batch / (line[-1].t_commit - line[0].t_commit)


def churn_window(plan: FaultPlan, applied: list[Applied], launch_t: float) -> tuple[float, float]:
    return applied[0].t, launch_t + plan.end_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--interval-s", type=float, default=15.0)
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--first-s", type=float, default=25.0)
    parser.add_argument("--spares", type=int, default=1,
                        help="warm spares the replacements come from (shoal and torchft alike)")
    parser.add_argument("--detect-s", type=float, default=1.0)
    parser.add_argument("--skip-torchft", action="store_true")
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    from shoal.spec import load_job

    batch = load_job(JOB).global_batch
    kills = int(args.duration_s // args.interval_s)
    plan = FaultPlan(Fault.kill, kills, args.workers, args.first_s, args.interval_s,
                     tail_s=args.interval_s)
    log(f"plan: {plan.describe()}")

    _, records = run_shoal(JOB, args.workers, 200)
    shoal_free, rate = samples_per_s(records, WARMUP), steps_per_s(records, WARMUP)
    log(f"shoal fault-free at {args.workers} workers: {shoal_free:.1f} samples/s")
    report, commits, applied, launch_t = shoal_under_plan(
        JOB, plan, int(rate * plan.end_s * 1.3) + 100, args.spares, args.detect_s)
    shoal_rate = useful_rate(commits, *churn_window(plan, applied, launch_t), batch)
    shoal_faults = figures_of(commits, applied, launch_t, plan)
    log(f"shoal under churn: {shoal_rate:.1f} samples/s")
    result: dict[str, object] = {
        "efficiency": round(shoal_rate / shoal_free, 4),
        "samples_per_s": round(shoal_rate, 2), "fault_free_samples_per_s": round(shoal_free, 2),
        "plan": plan.describe(), "spares": args.spares,
        "rto_s_median": median([f.rto_s for f in shoal_faults]),
        "rto_full_s_median": median([f.rto_full_s for f in shoal_faults]),
        "steps_lost": sum(f.steps_lost for f in shoal_faults),
        "samples_skipped": report.samples_skipped, "samples_duplicated": report.samples_duplicated,
        "replica_mismatches": report.replica_mismatches,
        "detection": {"shoal": shoal_detection(args.detect_s)},
    }
    ft_eff = None
    if not args.skip_torchft:
        from bench.reference.torchft_ref import (
            LighthouseConfig, torchft_detection, torchft_fault_free, torchft_under_plan,
        )

        # torchft's deadline for a silent peer is its collective timeout: the same as shoal's.
        free_commits, _ = torchft_fault_free(JOB, args.workers, 60.0, timeout_s=args.detect_s)
        ft_free = steady_rate(free_commits, batch)
        log(f"torchft fault-free at {args.workers} workers: {ft_free:.1f} samples/s")
        ft_commits, ft_applied, ft_launch = torchft_under_plan(
            JOB, plan, warm_spare=args.spares > 0, timeout_s=args.detect_s)
        ft_rate = useful_rate(ft_commits, *churn_window(plan, ft_applied, ft_launch), batch)
        ft_faults = figures_of(ft_commits, ft_applied, ft_launch, plan)
        ft_eff = ft_rate / ft_free
        log(f"torchft under churn: {ft_rate:.1f} samples/s")
        result.update({
            "torchft_efficiency": round(ft_eff, 4), "torchft_samples_per_s": round(ft_rate, 2),
            "torchft_fault_free_samples_per_s": round(ft_free, 2),
            "efficiency_ratio": round(result["efficiency"] / ft_eff, 3) if ft_eff > 0 else None,
            "torchft_rto_s_median": median([f.rto_s for f in ft_faults]),
            "torchft_rto_full_s_median": median([f.rto_full_s for f in ft_faults]),
        })
        result["detection"]["torchft"] = torchft_detection(LighthouseConfig(), args.detect_s)
    efficiency = result["efficiency"]
    result["targets_met"] = {
        "efficiency_ge_0_85": efficiency >= 0.85,
        "efficiency_ge_2x_torchft": None if ft_eff is None else efficiency >= 2 * ft_eff,
        "exact": all(result[k] == 0 for k in ("steps_lost", "samples_skipped",
                                               "samples_duplicated", "replica_mismatches")),
    }
    print(json.dumps(result))
    if args.record:
        append_result("churn", result)


if __name__ == "__main__":
    main()
