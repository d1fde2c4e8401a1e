"""Churn benchmark: a worker is killed every 15 s and a replacement joins (from
a warm spare by default), for at least 3 minutes; committed-work efficiency
is the useful samples/s over what a fault-free run gives at the same average
world size (measured in the same run at 2 and 3 workers, interpolated).

    .venv/bin/python -m bench.churn [--workers 3] [--interval-s 15] [--duration-s 180]

Prints progress to stderr and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.shoal_side import median, run_shoal, samples_per_s, steps_per_s

JOB = "bench/elastic-gpt.toml"
WARMUP = 20


def log(message: str) -> None:
    print(f"[bench.churn] {message}", file=sys.stderr, flush=True)


def time_weighted_world(steps) -> float:
    """Average world size over the run, each step weighted by how long it took to commit."""
    total = weighted = 0.0
    for before, step in zip(steps, steps[1:]):
        dt = step.t_commit - before.t_commit
        total += dt
        weighted += dt * step.world
    return weighted / total


def fault_free(workers: int, steps: int) -> tuple[float, float]:
    _, records = run_shoal(JOB, workers, steps)
    return samples_per_s(records, WARMUP), steps_per_s(records, WARMUP)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--interval-s", type=float, default=15.0)
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--join-after-s", type=float, default=2.0)
    parser.add_argument("--first-fault-s", type=float, default=20.0)
    parser.add_argument("--spares", type=int, default=1,
                        help="warm spares the replacements come from (0: start each one cold)")
    args = parser.parse_args()

    reference = {}
    for world in (args.workers - 1, args.workers):
        reference[world] = fault_free(world, 200)
        log(f"fault-free at {world} workers: {reference[world][0]:.1f} samples/s")

    kills = int(args.duration_s // args.interval_s)
    chaos = ",".join(
        f"kill:{k}@{args.first_fault_s + k * args.interval_s:g}s,"
        f"join@{args.first_fault_s + k * args.interval_s + args.join_after_s:g}s"
        for k in range(kills))
    end_s = args.first_fault_s + kills * args.interval_s + 5.0
    slowest_rate = reference[args.workers - 1][1]
    steps = int(slowest_rate * end_s)
    log(f"{kills} kills, one every {args.interval_s:g} s; {steps} steps")
    report, records = run_shoal(JOB, args.workers, steps, chaos, timeout_s=end_s * 4 + 300,
                                spares=args.spares)

    kept = [r for r in records if r.step >= WARMUP]
    achieved = samples_per_s(records, WARMUP)
    world = time_weighted_world(kept)
    low, high = args.workers - 1, args.workers
    fraction = min(1.0, max(0.0, world - low))
    expected = reference[low][0] + fraction * (reference[high][0] - reference[low][0])
    kills_done = [f for f in report.faults if f.kind.value == "kill"]
    result = {
        "efficiency": round(achieved / expected, 4),
        "samples_per_s": round(achieved, 2),
        "fault_free_samples_per_s_at_avg_world": round(expected, 2),
        "avg_world": round(world, 3),
        "fault_free_samples_per_s": {str(w): round(v[0], 2) for w, v in reference.items()},
        "kills": len(kills_done),
        "spares": args.spares,
        "duration_s": round(kept[-1].t_commit - kept[0].t_commit, 1),
        "rto_s_median": median([f.recovery_s for f in kills_done]),
        "steps_lost": sum(f.steps_lost for f in kills_done),
        "samples_skipped": report.samples_skipped,
        "samples_duplicated": report.samples_duplicated,
        "replica_mismatches": report.replica_mismatches,
        "target_met": achieved / expected >= 0.85,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
