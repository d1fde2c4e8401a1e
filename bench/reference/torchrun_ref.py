"""torchrun with checkpoint restart: the recovery every elastic system is measured against.

DDP over gloo under `torchrun --nnodes=1 --rdzv-backend=c10d --max-restarts`, rank 0
checkpointing every job.checkpoint.interval_steps in the background. A killed
worker makes the agent stop the group, re-rendezvous and start every worker
again, which resumes from the newest checkpoint. The fastest torchrun setup
measured here (see ddp_worker.torchrun_command): one node, so no last-call
wait; monitor interval 0.1 s; the corpus cached as .npy so a restarted worker
does not re-read it; each attempt's gloo keys under their own store prefix.

Per kill: rto_s is shoal.control.recovery.recovery_s over the steps that started
between this kill and the next; steps_lost counts steps committed before the
kill that ran again after it (those since the last checkpoint).

    .venv/bin/python -m bench.reference.torchrun_ref --job bench/elastic-gpt.toml \\
        --workers 3 --kills 2 --interval-s 12
"""

from __future__ import annotations

import argparse
import json
import time
from subprocess import Popen

from bench.reference.common import (
    FaultResult, ReferenceRunError, RunDirectory, exit_on_sigterm, fault_results, read_step_logs,
    worker_env, worker_threads,
)
from bench.reference.ddp_worker import torchrun_command
from bench.reference.faults import KillSchedule, run_kills
from bench.reference.training import cache_corpus, check_workers

_OUTPUT = "torchrun.log"


class TorchrunTarget:
    """A torchrun agent and the workers it (re)starts; the kill loop's FaultTarget."""

    def __init__(self, run: RunDirectory, agent: Popen, workers: int) -> None:
        self.run, self.agent, self.workers = run, agent, workers

    def healthy(self) -> None:
        if self.agent.poll() is not None:
            raise ReferenceRunError(f"torchrun exited with {self.agent.returncode}: "
                                    f"{self.run.tail(_OUTPUT)}")

    def prepare_kill(self, k: int) -> None:
        pass  # torchrun has no spares: its agent starts every worker anew

    def victim_pid(self, k: int) -> int:
        # Rotate over ranks; rank 0 (the checkpoint writer) is hit like any other.
        return self.run.registered_pids()[f"rank{k % self.workers}"]

    def after_kill(self, k: int) -> None:
        pass  # the agent notices within its 0.1 s monitor interval and restarts the group


def torchrun_faults(job_path: str, workers: int, kills: int, interval_s: float) -> list[FaultResult]:
    """SIGKILL one torchrun worker (never the agent) every `interval_s`, `kills` times."""
    job = check_workers(job_path, workers)
    schedule = KillSchedule(kills, interval_s)
    with RunDirectory("torchrun") as run:
        corpus = cache_corpus(job, run.path)
        command = torchrun_command(job_path, corpus, run.path, workers, job.steps,
                                   worker_threads(workers), max_restarts=kills + 2,
                                   checkpoint_dir=run.path / "checkpoints")
        launch_t = time.time()
        target = TorchrunTarget(run, run.start(command, _OUTPUT, worker_env()), workers)
        fault_times = run_kills(run, schedule, target)
        return fault_results(read_step_logs(run.logs), fault_times, launch_t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="bench/elastic-gpt.toml")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--interval-s", type=float, default=12.0)
    args = parser.parse_args()
    exit_on_sigterm()
    started = time.monotonic()
    results = torchrun_faults(args.job, args.workers, args.kills, args.interval_s)
    print(json.dumps({
        "reference": "torchrun", "workers": args.workers,
        "faults": [r.as_dict() for r in results],
        "wall_s": round(time.monotonic() - started, 1),
    }))


if __name__ == "__main__":
    main()
