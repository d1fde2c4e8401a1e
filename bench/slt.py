"""Bounded staleness against a slow exchange (issue 11): the small GPT of the sync
tests on 3 local workers, DiLoCo with every outer exchange made to take at least
`--delay-s` seconds (an injected exchange-delay), at slt = 0 and at slt = 1, 2,
with the same delay, shares (no rebalancing) and steps.

The delay stands for a slow link that the votes' few bytes do not queue behind
(a fair-queued link). Under this kernel's tbf, one FIFO queue with no fq_codel or
sfq, they do queue: a 1 Mbit/s host link made every outer step ~1.06 s at slt = 0
and at slt = 1 alike (the inner steps' vote waited behind the background
exchange's backlog), so overlap gained nothing there; that is why the delay is
injected here instead.

Figures per slt: `s_per_step` (wall time from step 0's commit to the last one's,
over the steps between), `outer_step_s` (median duration of an outer step),
`val_loss` at the end, and the report's `slt_seen`. The reference is slt = 0 in the
same run of this script: `speedup` is its s_per_step over each slt's.

    .venv/bin/python -m bench.slt [--steps 150] [--delay-s 1.0] [--slt 1 2]

Prints progress to stderr and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.history import RECORD_HELP, append_result
from bench.shoal_side import scratch_dir
from shoal.elastic.launcher import LaunchConfig, Launcher
from shoal.train.run_config import RunSettings
from shoal.spec import parse_job
from shoal.train.step_log import read_step_logs

WORKERS = 3


def log(message: str) -> None:
    print(f"[bench.slt] {message}", file=sys.stderr, flush=True)


def job_for(slt: int, steps: int, inner_steps: int):
    # The sync tests' model (tests/train/test_sync_elastic.py): ~22k parameters, so one
    # pseudo-gradient is ~90 kB, about a second on a 1 Mbit/s link.
    return parse_job({"name": f"slt{slt}", "seed": 5, "steps": steps, "global_batch": 12,
                      "eval_batches": 4,
                      "model": {"layers": 1, "heads": 2, "width": 32, "context": 32},
                      "data": {"max_bytes": 300_000}, "schedule": {"warmup_steps": 5},
                      "sync": {"mode": "diloco", "inner_steps": inner_steps, "slt": slt}})


def train(job, delay_s: float, run_dir: Path) -> dict:
    config = LaunchConfig(
        command=[sys.executable, "-m", "shoal.models.gpt_worker", "--job-json", job.model_dump_json()],
        # Fencing waits 10 s, not 1: a whole second's exchange is not a stall (the same
        # for every slt; at 1 s the reference run at slt = 0 re-formed 8 times once).
        workers=WORKERS, run_dir=run_dir, timeout_s=1800, stall_deadline_s=10.0,
        settings=RunSettings(rebalance_interval=0, inject=f"exchange-delay:{delay_s}"),
        env={"OMP_NUM_THREADS": "1"})
    report = Launcher(config).run()
    if report.steps != job.steps:
        raise RuntimeError(f"{job.name}: {report.steps} of {job.steps} steps")
    commits = sorted({r.step: r.t_commit for r in read_step_logs(run_dir) if r.rank == 0}.items())
    took = {b[0]: b[1] - a[1] for a, b in zip(commits, commits[1:])}
    h = job.sync.inner_steps
    outer = [t for step, t in took.items() if (step + 1) % h == 0]
    return {"s_per_step": round((commits[-1][1] - commits[0][1]) / (len(commits) - 1), 4),
            "outer_step_s": round(statistics.median(outer), 3),
            "val_loss": round(report.val_loss, 4), "slt_seen": report.slt_seen,
            "rounds_late": report.rounds_late, "rounds_dropped": report.rounds_dropped,
            "samples_dropped": report.samples_dropped, "epochs": report.epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--delay-s", type=float, default=1.0)
    parser.add_argument("--slt", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    runs = {}
    with scratch_dir("shoal-slt-") as scratch:
        for slt in [0, *args.slt]:
            runs[slt] = train(job_for(slt, args.steps, args.inner_steps), args.delay_s,
                              Path(scratch) / f"slt{slt}")
            log(f"slt {slt}: {runs[slt]}")
    reference = runs[0]["s_per_step"]
    result = {
        "workers": WORKERS, "exchange_delay_s": args.delay_s, "steps": args.steps,
        "inner_steps": args.inner_steps,
        "runs": {f"slt{k}": {**v, "speedup": round(reference / v["s_per_step"], 3)}
                 for k, v in runs.items()},
        "emulation": "every outer exchange takes >= exchange_delay_s (injected); votes unaffected"}
    print(json.dumps(result))
    if args.record:
        append_result("slt", result)


if __name__ == "__main__":
    main()
