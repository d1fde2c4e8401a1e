"""Elastic runtime benchmark: one fault (kill, host-kill, partition or stall)
applied the same way to shoal, torchrun and torchft — the same victims
(rotating over ranks, rank 0 first), at the same seconds after each system's
start, with the detection settings written into the result — plus data
exactness and fault-free overhead against static DDP, all in one run.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python -m bench.elastic --fault kill [--workers 3] [--count 3] [--spares 1]

kill and stall run on this host; host-kill and partition put every worker of
every system on a host of its own (network namespaces, needs root).
Prints progress to stderr and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.fault_plan import Fault, FaultPlan
from bench.figures import figures_of, median, summary
from bench.shoal_side import (
    run_shoal, samples_per_s, shoal_detection, shoal_under_plan, steps_per_s,
)
from bench.history import RECORD_HELP, append_result

JOB = "bench/elastic-gpt.toml"
HOST_FAULTS = (Fault.host_kill, Fault.partition)


def log(message: str) -> None:
    print(f"[bench.elastic] {message}", file=sys.stderr, flush=True)


def measure_overhead(workers: int, steps: int, warmup: int, rounds: int) -> dict[str, float]:
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
    return {"overhead": round(1.0 - shoal_m / ddp_m, 4), "ddp_samples_per_s": ddp_m,
            "shoal_samples_per_s": shoal_m, "steps_per_s": median(rate)}


def run_references(plan: FaultPlan, skip: set[str], collective_timeout_s: float) -> dict[str, dict]:
    """torchrun and torchft through the same plan; a system that cannot run says why."""
    from bench.reference.torchft_ref import LighthouseConfig, torchft_detection, torchft_under_plan
    from bench.reference.torchrun_ref import torchrun_detection, torchrun_under_plan

    lighthouse = LighthouseConfig()
    results: dict[str, dict] = {}
    if "torchrun" not in skip:
        commits, applied, launch_t = torchrun_under_plan(JOB, plan)
        results["torchrun"] = {**summary(figures_of(commits, applied, launch_t, plan)),
                               "detection": torchrun_detection()}
        log(f"torchrun: {_brief(results['torchrun'])}")
    if "torchft" not in skip:
        commits, applied, launch_t = torchft_under_plan(JOB, plan, lighthouse=lighthouse,
                                                        timeout_s=collective_timeout_s)
        results["torchft"] = {**summary(figures_of(commits, applied, launch_t, plan)),
                              "detection": torchft_detection(lighthouse, collective_timeout_s)}
        log(f"torchft: {_brief(results['torchft'])}")
    return results


def _brief(result: dict) -> str:
    return ", ".join(f"{k} {result[k]}" for k in ("rto_s", "rto_full_s", "lost_s", "pause_s",
                                                   "steps_lost"))


def targets(fault: Fault, shoal: dict, refs: dict, exact: dict, spares: int,
            overhead: float | None) -> dict[str, bool | None]:
    """Each target of issue 7; None where this run does not measure it."""
    ft = refs.get("torchft", {})

    def at_most(value, bound, reference):
        if value is None:
            return False
        return value <= bound and (reference is None or value <= reference)

    step = shoal["median_step_s"]
    return {
        "partition_rto_le_2s_and_torchft": (at_most(shoal["rto_s"], 2.0, ft.get("rto_s"))
                                            if fault is Fault.partition else None),
        "kill_spare_rto_full_le_1s_and_torchft": (
            at_most(shoal["rto_full_s"], 1.0, ft.get("rto_full_s"))
            if fault is Fault.kill and spares > 0 else None),
        "stall_pause_le_3_steps_plus_1s": (
            shoal["pause_s"] is not None and step is not None and shoal["pause_s"] <= 3 * step + 1.0
            if fault is Fault.stall else None),
        "exact": all(v == 0 for v in exact.values()),
        "overhead_le_3pct": None if overhead is None else overhead <= 0.03,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", type=Fault, choices=list(Fault), default=Fault.kill)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--count", "--kills", type=int, default=3, help="faults to apply")
    parser.add_argument("--first-s", type=float, default=None,
                        help="seconds after start of the first fault (default 25; 60 for the "
                             "host faults, whose 2W+1 namespaced processes start slowly here)")
    parser.add_argument("--interval-s", type=float, default=15.0)
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--spares", type=int, default=1, help="warm spares (shoal and torchft)")
    parser.add_argument("--detect-s", type=float, default=1.0,
                        help="shoal's liveness floor and torchft's heartbeat timeout")
    parser.add_argument("--collective-timeout-s", type=float, default=None,
                        help="torchft's collective timeout, its deadline for a silent peer "
                             "(default: --detect-s, the same as shoal's liveness floor)")
    parser.add_argument("--overhead-steps", type=int, default=150)
    parser.add_argument("--overhead-rounds", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[],
                        choices=["overhead", "torchrun", "torchft"])
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    skip = set(args.skip)
    if args.collective_timeout_s is None:
        args.collective_timeout_s = args.detect_s
    first_s = args.first_s if args.first_s is not None else (
        60.0 if args.fault in HOST_FAULTS else 25.0)
    plan = FaultPlan(args.fault, args.count, args.workers, first_s, args.interval_s, args.stall_s)
    log(f"plan: {plan.describe()}")

    result: dict[str, object] = {"fault": plan.fault.value, "plan": plan.describe(),
                                 "workers": args.workers, "spares": args.spares}
    overhead = None
    if "overhead" not in skip:
        measured = measure_overhead(args.workers, args.overhead_steps, 20, args.overhead_rounds)
        overhead, rate = measured["overhead"], measured["steps_per_s"]
        result.update(measured)
        log(f"overhead {overhead:+.3f}")
    else:
        _, records = run_shoal(JOB, args.workers, 80)
        rate = steps_per_s(records, 20)

    if plan.fault in HOST_FAULTS:
        from bench.hosts import run_on_hosts

        shoal, refs, exact = run_on_hosts(JOB, plan, rate, args, skip, log)
    else:
        steps = int(rate * plan.end_s * 1.3) + 100
        report, commits, applied, launch_t = shoal_under_plan(JOB, plan, steps, args.spares,
                                                              args.detect_s)
        shoal = {**summary(figures_of(commits, applied, launch_t, plan)),
                 "detection": shoal_detection(args.detect_s)}
        exact = {"samples_skipped": report.samples_skipped,
                 "samples_duplicated": report.samples_duplicated,
                 "replica_mismatches": report.replica_mismatches, "steps_lost": shoal["steps_lost"]}
        log(f"shoal: {_brief(shoal)}")
        refs = run_references(plan, skip, args.collective_timeout_s)

    result.update({k: shoal[k] for k in ("rto_s", "rto_full_s", "lost_s", "pause_s",
                                         "median_step_s")})
    result.update(exact)
    for name, ref in refs.items():
        result.update({f"{name}_{k}": ref.get(k) for k in ("rto_s", "rto_full_s", "lost_s", "pause_s")})
    result["shoal"] = shoal
    result.update(refs)
    result["targets_met"] = targets(plan.fault, shoal, refs, exact, args.spares, overhead)
    print(json.dumps(result))
    if args.record:
        append_result("elastic", result)


if __name__ == "__main__":
    main()
