"""torchrun with checkpoint restart: the recovery every elastic system is measured against.

DDP over gloo under `torchrun --nnodes=1 --rdzv-backend=c10d --max-restarts`, rank 0
checkpointing every job.checkpoint.interval_steps in the background. A killed
worker makes the agent stop the group, re-rendezvous and start every worker
again, which resumes from the newest checkpoint. The fastest torchrun setup
measured here (see ddp_worker.torchrun_command): one node, so no last-call
wait; monitor interval 0.1 s; the corpus cached as .npy so a restarted worker
does not re-read it; each attempt's gloo keys under their own store prefix.

The fault driver (bench.fault_plan) hits the worker holding a rank; torchrun
has no spares, so its replacement is the agent's restart of the whole group.

    .venv/bin/python -m bench.reference.torchrun_ref --workers 3 --fault kill --count 2
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from bench.fault_plan import Applied, Fault, FaultPlan, drive
from bench.figures import Commit, figures_of
from bench.reference.common import (
    ReferenceRunError, RunDirectory, commits_of, exit_on_sigterm, read_step_logs, worker_env,
    worker_threads,
)
from bench.reference.ddp_worker import torchrun_command
from bench.reference.training import cache_corpus, check_workers

_OUTPUT = "torchrun.log"
MONITOR_INTERVAL_S = 0.1
COLLECTIVE_TIMEOUT_S = 60.0


class TorchrunTarget:
    """A torchrun agent and the workers it (re)starts: a fault target."""

    def __init__(self, run: RunDirectory, command: list[str]) -> None:
        self.run = run
        self.launch_t = time.time()
        self.agent = run.start(command, _OUTPUT, worker_env())

    def healthy(self) -> None:
        if self.agent.poll() is not None:
            raise ReferenceRunError(f"torchrun exited with {self.agent.returncode}: "
                                    f"{self.run.tail(_OUTPUT)}")

    def victim_pids(self, rank: int, whole_host: bool) -> list[int]:
        if whole_host:
            raise ValueError("host-kill needs hosts: run it with the namespaced placement")
        return [self.run.registered_pids()[f"rank{rank}"]]  # the newest attempt's rank

    def partition(self, rank: int) -> None:
        raise ValueError("partition needs hosts: run it with the namespaced placement")

    def replace(self, k: int) -> None:
        pass  # torchrun has no spares: its agent restarts every worker (0.1 s monitor interval)


def torchrun_under_plan(job_path: str, plan: FaultPlan) -> tuple[list[Commit], list[Applied], float]:
    """Run torchrun + DDP with checkpoint restart through `plan`."""
    job = check_workers(job_path, plan.workers)
    with RunDirectory("torchrun") as run:
        corpus = cache_corpus(job, run.path)
        command = torchrun_command(job_path, corpus, run.path, plan.workers, job.steps,
                                   worker_threads(plan.workers), max_restarts=plan.count + 2,
                                   checkpoint_dir=run.path / "checkpoints")
        target = TorchrunTarget(run, command)
        applied = drive(plan, target)
        return commits_of(read_step_logs(run.logs)), applied, target.launch_t


def torchrun_detection() -> dict[str, object]:
    return {"rdzv_backend": "c10d", "nnodes": "1 (no last-call wait)",
            "monitor_interval_s": MONITOR_INTERVAL_S, "collective_timeout_s": COLLECTIVE_TIMEOUT_S,
            "checkpoint_every_steps": "job.checkpoint.interval_steps"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="bench/elastic-gpt.toml")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--fault", type=Fault, default=Fault.kill)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--interval-s", type=float, default=15.0)
    args = parser.parse_args()
    exit_on_sigterm()
    plan = FaultPlan(args.fault, args.count, args.workers, interval_s=args.interval_s)
    commits, applied, launch_t = torchrun_under_plan(args.job, plan)
    print(json.dumps({"reference": "torchrun", "plan": plan.describe(),
                      "detection": torchrun_detection(),
                      "faults": [asdict(f) for f in figures_of(commits, applied, launch_t, plan)]}))


if __name__ == "__main__":
    main()
