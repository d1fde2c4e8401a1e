"""Robust aggregation under attack (issue 10): the tiny GPT on 4 workers, one of
which sends −10× its gradient on every step (`sign_flip_scaled`, no audits),
under each aggregation rule, against the honest run with the plain mean.

For every rule: `loss_gap` (final validation loss of the attacked run minus
the honest mean run's) and `throughput_cost` (1 − samples/s of an honest run
under that rule over samples/s of the honest mean run, same settings, steps
after `--warmup` only, from the median step interval so that a burst of
other load on a shared machine does not decide it). Because whole runs on a
busy machine are noisy, `exchange_s` also times the exchange alone, paired:
4 gloo ranks (a process each) with the job's buffers, alternating
the rules step by step, and `exchange_cost` turns the extra seconds into a
throughput cost against the honest mean run's step time. Every run is the
same job (examples/tiny-gpt.toml with `--steps`), seed, workers and victim;
shares are rebalanced by measured speed as in any run, so the robust rules'
losses move a little with the machine's load (the mean's do not). `floor_gap` sizes
what a rule that leaves the cheat's samples out can reach at best: the plain mean
on the other workers alone (one fewer, the global batch cut to their part of it;
the same seed, but other batches). Target: some rule keeps
`loss_gap <= 0.05` while the plain mean diverges (its gap above 1 nat), at a
throughput cost <= 10%.

    .venv/bin/python -m bench.robust [--steps 150] [--workers 4] [--rounds 1] [--rules RULE ...]

Prints progress to stderr and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from bench.history import RECORD_HELP, append_result
from bench.shoal_side import median, samples_per_s, scratch_dir
from shoal.elastic.launcher import Launcher, LaunchConfig
from shoal.elastic.report import lineage
from shoal.spec import load_job
from shoal.spec.elastic import ElasticReport
from shoal.spec.job import Aggregation
from shoal.train.run_config import RunSettings, WorkerOverrides
from shoal.train.step_log import read_step_logs

JOB = "examples/tiny-gpt.toml"
ADVERSARY = "sign_flip_scaled"
VICTIM = 1  # the worker that cheats (rank 0 reports the figures, so not that one)
RULES = [rule.value for rule in Aggregation]
TARGETS = {"loss_gap_max": 0.05, "mean_gap_min": 1.0, "throughput_cost_max": 0.10}


def log(message: str) -> None:
    print(f"[bench.robust] {message}", file=sys.stderr, flush=True)


def train(rule: str, workers: int, steps: int, warmup: int, attacked: bool,
          global_batch: int | None = None) -> dict:
    """One launch of the job under `rule`; its val loss, throughput and replica checks."""
    overrides = {"steps": steps, "aggregation": rule}
    job = load_job(JOB, overrides=overrides if global_batch is None
                   else {**overrides, "global_batch": global_batch})
    with scratch_dir("shoal-robust-") as scratch:
        run_dir = Path(scratch) / "run"
        config = LaunchConfig(
            command=[sys.executable, "-m", "shoal.models.gpt_worker", "--job-json",
                     job.model_dump_json()],
            workers=workers, run_dir=run_dir, timeout_s=1800,
            overrides={VICTIM: WorkerOverrides(adversary=ADVERSARY)} if attacked else {},
            settings=RunSettings(checkpoint_dir=str(Path(scratch) / "ckpt"),
                                 checkpoint_interval=steps + 1,  # no checkpoint inside the run
                                 replica_check_interval=10, identity=job.resume_identity()),
        )
        report: ElasticReport = Launcher(config).run()
        records = lineage(read_step_logs(run_dir))
    intervals = [b.t_commit - a.t_commit for a, b in zip(records, records[1:]) if a.step >= warmup]
    measured = len(intervals) >= 2  # else the step logs say too little (reported, not hidden)
    result = {"val_loss": _finite(report.val_loss), "steps": report.steps,
              "logged_steps": len(records),
              "samples_per_s": round(job.global_batch / statistics.median(intervals), 2)
              if measured else None,
              "samples_per_s_mean": round(samples_per_s(records, warmup), 2) if measured else None,
              "replica_mismatches": report.replica_mismatches,
              "replica_checks": report.replica_checks,
              "guard_skipped_steps": report.guard_skipped_steps}
    log(f"{rule:>13} {'attacked' if attacked else 'honest':>8}: {result}")
    return result


def time_exchanges(workers: int, reps: int, rules: list[str]) -> dict[str, float]:
    """Median seconds of one exchange of the job's buffers under each rule, the rules
    alternating step by step so that they share whatever load the machine has.

    One process per rank, as in a run (ranks as threads of one process would share
    its GIL, which a run's workers do not), and every timed exchange starts after a
    one-float all-reduce, so that no rank is still busy with the previous rule's
    arithmetic: without it the plain mean's time took in the robust rules' tails."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # no forked torch state
    with scratch_dir("shoal-robust-x-") as scratch:
        results = context.Queue()
        processes = [context.Process(target=_exchange_rank,
                                     args=(str(Path(scratch) / "store"), rank, workers, reps,
                                           rules, results))
                     for rank in range(workers)]
        for process in processes:
            process.start()
        deadline = time.monotonic() + 600
        while results.empty():  # rank 0's medians
            failed = [process.exitcode for process in processes if process.exitcode]
            if failed or time.monotonic() > deadline:
                for process in processes:
                    process.kill()
                raise RuntimeError(f"the exchange timing failed (rank exit codes {failed}) "
                                   f"or took over 600 s")
            time.sleep(0.2)
        times = results.get()
        for process in processes:
            process.join(timeout=60)
    return times


def _exchange_rank(store_path: str, rank: int, workers: int, reps: int, rules: list[str],
                   results) -> None:
    import torch
    import torch.distributed as dist

    from shoal.models.model import GPT
    from shoal.train.sync.exchange import GradientExchange
    from shoal.train.group import EpochGroup

    torch.set_num_threads(1)  # as the launcher runs workers on this machine
    torch.manual_seed(rank)
    params = list(GPT(load_job(JOB).model).parameters())
    store = dist.FileStore(store_path, workers)
    group = EpochGroup.build(store, 0, rank, workers, backend="gloo", timeout_s=120,
                             poll_s=0.001, should_cancel=lambda: False)
    weights, token = [1 / workers] * workers, torch.zeros(1)
    exchanges = {}  # one per rule, kept across steps as a run keeps its own
    for rule in rules:
        exchanges[rule] = GradientExchange(params, groups=2, aggregation=Aggregation(rule))
        exchanges[rule].fresh(workers)
    times: dict[str, list[float]] = {rule: [] for rule in rules}
    for _ in range(reps):
        for rule in rules:
            exchange = exchanges[rule]
            for buffer in exchange.tensors():
                buffer.normal_()
            group.all_reduce([token], lambda: False)  # all start together: a rank still busy
            # with the previous rule's arithmetic would otherwise be timed in this one
            start = time.perf_counter()
            if exchange.gathers:
                exchange.combine(group.all_gather(exchange.tensors(), lambda: False), weights)
            else:
                group.all_reduce(exchange.tensors(), lambda: False)
            times[rule].append(time.perf_counter() - start)
    group.abandon()
    if rank == 0:
        results.put({rule: round(statistics.median(ts), 5) for rule, ts in times.items()})


def _finite(value: float | None) -> float | None:
    return round(value, 4) if value is not None and math.isfinite(value) else None


def gap(loss: float | None, honest: float | None) -> float | None:
    """Val loss above the honest run's; None when the run's loss is not finite (diverged)."""
    return round(loss - honest, 4) if loss is not None and honest is not None else None


def summarise(honest: dict[str, list[dict]], attacked: dict[str, dict], floor: dict,
              exchange_s: dict[str, float], global_batch: int) -> dict:
    reference = honest["mean"][0]["val_loss"]
    speed = {rule: median([r["samples_per_s"] for r in runs]) for rule, runs in honest.items()}
    loss_gap = {rule: gap(attacked[rule]["val_loss"], reference) for rule in attacked}
    cost = {rule: round(1.0 - speed[rule] / speed["mean"], 4) for rule in speed if rule != "mean"}
    step_s = global_batch / speed["mean"]  # the honest mean run's median step
    paired = {rule: round((exchange_s[rule] - exchange_s["mean"]) / (step_s + exchange_s[rule]
                                                                      - exchange_s["mean"]), 4)
              for rule in exchange_s if rule != "mean"}
    mean_gap = loss_gap["mean"]
    mean_diverged = mean_gap is None or mean_gap > TARGETS["mean_gap_min"]
    winners = [rule for rule in cost if loss_gap[rule] is not None
               and loss_gap[rule] <= TARGETS["loss_gap_max"]
               and cost[rule] <= TARGETS["throughput_cost_max"]]
    return {
        "honest_val_loss": reference,
        "loss_gap": loss_gap,
        "floor_gap": gap(floor["val_loss"], reference),
        "throughput_cost": cost,
        "exchange_cost": paired,
        "samples_per_s": speed,
        "exchange_s": exchange_s,
        "honest_loss_gap": {rule: gap(runs[0]["val_loss"], reference)
                            for rule, runs in honest.items() if rule != "mean"},
        "replica_mismatches": sum(r["replica_mismatches"] for runs in honest.values() for r in runs)
        + sum(r["replica_mismatches"] for r in attacked.values()),
        "mean_diverged": mean_diverged,
        "targets": {**TARGETS, "met_by": winners, "met": bool(winners) and mean_diverged},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of throughput")
    parser.add_argument("--rounds", type=int, default=1,
                        help="honest runs per rule for throughput (median); loss from the first")
    parser.add_argument("--exchange-reps", type=int, default=40,
                        help="paired exchanges per rule in the exchange-only timing")
    parser.add_argument("--rules", nargs="+", choices=RULES, default=RULES,
                        help="rules to run (the plain mean always runs: it is the reference)")
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    rules = ["mean", *(rule for rule in args.rules if rule != "mean")]
    load_before = os.getloadavg()[0]
    exchange_s = time_exchanges(args.workers, args.exchange_reps, rules)
    log(f"exchange alone, median s: {exchange_s}")

    honest: dict[str, list[dict]] = {rule: [] for rule in rules}
    for _ in range(args.rounds):  # rules interleaved, so they share the machine's load
        for rule in rules:
            honest[rule].append(train(rule, args.workers, args.steps, args.warmup, attacked=False))
    attacked = {rule: train(rule, args.workers, args.steps, args.warmup, attacked=True)
                for rule in rules}
    job = load_job(JOB, overrides={"steps": args.steps})
    floor_batch = job.global_batch * (args.workers - 1) // args.workers
    floor = train("mean", args.workers - 1, args.steps, args.warmup, attacked=False,
                  global_batch=floor_batch)
    settings = {"job": JOB, "steps": args.steps, "workers": args.workers,
                "global_batch": job.global_batch, "model": job.model.model_dump(),
                "seed": job.seed, "adversary": f"{VICTIM}={ADVERSARY}", "every_step": True,
                "audits": False, "throughput_warmup_steps": args.warmup, "rounds": args.rounds,
                "exchange_reps": args.exchange_reps, "rules": rules,
                "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "cores": os.cpu_count()}
    result = {"bench": "robust", "settings": settings,
              **summarise(honest, attacked, floor, exchange_s, job.global_batch),
              "runs": {"honest": honest, "attacked": attacked, "floor": floor}}
    print(json.dumps(result), flush=True)
    if args.record:
        append_result("robust", result)


if __name__ == "__main__":
    main()
