"""Static DDP throughput: the fault-free baseline that shoal's overhead is measured against.

`workers` ranks of torch DistributedDataParallel over gloo, launched by torchrun
(one node, c10d rendezvous, no restarts): the way static DDP is run in practice,
and the same launcher and worker as the torchrun fault reference, so that the
two differ only by faults and checkpoints. The agent sleeps in steady state.

Measured total-time-based: global_batch × (steps after warm-up) divided by the
wall time from the commit of the last warm-up step to the commit of the last
step, on rank 0 (DDP ranks move in lockstep). Each rank uses cores/workers
intra-op threads (at least one).

    .venv/bin/python -m bench.reference.ddp_ref --job bench/elastic-gpt.toml --workers 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.reference.common import (
    ReferenceRunError, RunDirectory, exit_on_sigterm, read_step_logs, worker_env, worker_threads,
)
from bench.reference.ddp_worker import torchrun_command
from bench.reference.training import cache_corpus, check_workers

_OUTPUT = "torchrun.log"


def static_ddp_throughput(job_path: str, workers: int, steps: int, warmup_steps: int) -> float:
    """Samples/s of static DDP over the `steps` steps after `warmup_steps` (total-time-based)."""
    return _measure(job_path, workers, steps, warmup_steps)["samples_per_s"]


def _measure(job_path: str, workers: int, steps: int, warmup_steps: int) -> dict[str, float]:
    job = check_workers(job_path, workers)
    if steps < 1 or warmup_steps < 1:
        raise ValueError("steps and warmup_steps must be at least 1")
    with RunDirectory("ddp") as run:
        corpus = cache_corpus(job, run.path)
        command = torchrun_command(job_path, corpus, run.path, workers, warmup_steps + steps,
                                   worker_threads(workers))
        process = run.start(command, _OUTPUT, worker_env())
        timeout_s = 60 + 2 * (warmup_steps + steps)
        try:
            code = process.wait(timeout=timeout_s)
        except Exception as error:
            raise ReferenceRunError(f"static DDP did not finish in {timeout_s} s: "
                                    f"{run.tail(_OUTPUT)}") from error
        if code != 0:
            raise ReferenceRunError(f"static DDP exited with {code}: {run.tail(_OUTPUT)}")
        lines = sorted((s for s in read_step_logs(run.logs) if s.worker == "rank0"),
                       key=lambda s: s.step)
    measured = lines[warmup_steps:]
    elapsed = measured[-1].t_commit - lines[warmup_steps - 1].t_commit
    return {
        "samples_per_s": job.global_batch * len(measured) / elapsed,
        "step_s_median": statistics.median(s.t_commit - s.t_start for s in measured),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="bench/elastic-gpt.toml")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup-steps", type=int, default=20)
    args = parser.parse_args()
    exit_on_sigterm()
    started = time.monotonic()
    measured = _measure(args.job, args.workers, args.steps, args.warmup_steps)
    print(json.dumps({
        "reference": "static-ddp", "workers": args.workers, "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "samples_per_s": round(measured["samples_per_s"], 2),
        "step_s_median": round(measured["step_s_median"], 4),
        "wall_s": round(time.monotonic() - started, 1),
    }))


if __name__ == "__main__":
    main()
