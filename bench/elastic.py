"""Elastic runtime benchmark: recovery from SIGKILL against torchrun and
torchft, data exactness, and fault-free overhead against static DDP, all on
the same model (bench/elastic-gpt.toml) and workers, in one run.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python -m bench.elastic [--workers 3] [--kills 5] [--interval-s 12]

Prints progress to stderr and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.shoal_side import median, run_shoal, samples_per_s, steps_per_s

JOB = "bench/elastic-gpt.toml"


def log(message: str) -> None:
    print(f"[bench.elastic] {message}", file=sys.stderr, flush=True)


def measure_overhead(workers: int, steps: int, warmup: int, rounds: int) -> tuple[float, float, float, float]:
    """Alternate static DDP and shoal (no faults) so both see the same machine load."""
    from bench.reference.ddp_ref import static_ddp_throughput

    ddp, shoal, rate = [], [], []
    for round_index in range(rounds):
        ddp.append(static_ddp_throughput(JOB, workers, steps, warmup))
        _, records = run_shoal(JOB, workers, steps)
        shoal.append(samples_per_s(records, warmup))
        rate.append(steps_per_s(records, warmup))
        log(f"round {round_index + 1}: ddp {ddp[-1]:.1f} samples/s, shoal {shoal[-1]:.1f} samples/s")
    ddp_m, shoal_m = median(ddp), median(shoal)
    return round(1.0 - shoal_m / ddp_m, 4), ddp_m, shoal_m, median(rate)


def measure_shoal_faults(workers: int, kills: int, interval_s: float, steps_per_second: float):
    """SIGKILL one worker every interval (a replacement joins 3 s later), `kills` times."""
    period = max(20, round(interval_s * steps_per_second))
    warm = max(20, round(5 * steps_per_second))
    chaos = ",".join(f"kill@step{warm + k * period},join@step{warm + k * period + period // 3}"
                     for k in range(kills))
    total = warm + kills * period + period
    report, _ = run_shoal(JOB, workers, total, chaos)
    killed = [f for f in report.faults if f.kind.value == "kill"]
    return report, killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--interval-s", type=float, default=12.0)
    parser.add_argument("--overhead-steps", type=int, default=150)
    parser.add_argument("--overhead-rounds", type=int, default=3)
    parser.add_argument("--skip-references", action="store_true",
                        help="shoal only (when the bench extra is not installed)")
    args = parser.parse_args()

    overhead, ddp_tp, shoal_tp, rate = measure_overhead(args.workers, args.overhead_steps, 20,
                                                        args.overhead_rounds)
    log(f"overhead {overhead:+.3f} (ddp {ddp_tp} vs shoal {shoal_tp} samples/s)")

    report, killed = measure_shoal_faults(args.workers, args.kills, args.interval_s, rate)
    shoal_rtos = [f.recovery_s for f in killed]
    log(f"shoal RTO per kill: {shoal_rtos}")

    torchrun_rtos = torchft_rtos = []
    if not args.skip_references:
        from bench.reference.torchft_ref import torchft_faults
        from bench.reference.torchrun_ref import torchrun_faults

        torchrun_rtos = [f.rto_s for f in torchrun_faults(JOB, args.workers, args.kills, args.interval_s)]
        log(f"torchrun RTO per kill: {torchrun_rtos}")
        torchft_rtos = [f.rto_s for f in torchft_faults(JOB, args.workers, args.kills, args.interval_s)]
        log(f"torchft RTO per kill: {torchft_rtos}")

    rto, torchrun_rto, torchft_rto = median(shoal_rtos), median(torchrun_rtos), median(torchft_rtos)
    result = {
        "rto_s": rto,
        "torchrun_rto_s": torchrun_rto,
        "torchft_rto_s": torchft_rto,
        "rpo_steps": max((f.steps_lost for f in killed), default=0),
        "overhead": overhead,
        "samples_skipped": report.samples_skipped,
        "samples_duplicated": report.samples_duplicated,
        "replica_mismatches": report.replica_mismatches,
        "kills": len(killed),
        "rto_s_each": shoal_rtos,
        "detection_s_each": [f.detection_s for f in killed],
        "torchrun_rto_s_each": torchrun_rtos,
        "torchft_rto_s_each": torchft_rtos,
        "ddp_samples_per_s": ddp_tp,
        "shoal_samples_per_s": shoal_tp,
        "workers": args.workers,
    }
    result["targets_met"] = {
        "rto_le_1s": rto is not None and rto <= 1.0,
        "rto_le_torchrun_over_20": None if torchrun_rto is None else rto <= torchrun_rto / 20,
        "rto_le_torchft": None if torchft_rto is None else rto <= torchft_rto,
        "rpo_zero": result["rpo_steps"] == 0,
        "overhead_le_3pct": overhead <= 0.03,
        "exact_data": report.samples_skipped == 0 and report.samples_duplicated == 0,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
