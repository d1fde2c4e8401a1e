"""torchft: per-step quorum through a lighthouse, live recovery from a peer.

One torchft replica group (one process) per worker, all on one lighthouse with
--min_replicas 1 (LighthouseConfig says why its timeouts are what they are).
Each replica runs bench.reference.torchft_worker (Manager, synchronous quorum,
manager.allreduce on a flat gradient, OptimizerWrapper / should_commit). The
fault driver (bench.fault_plan) hits the replica holding a rank; a fault that
removes it calls in a warm spare, exactly as shoal's launcher does: one spare
is kept started (torch imported, model built) and contacts the lighthouse only
once called in, and a new spare starts as soon as one is called in. The spare
heals from a live peer over HTTP, which restores the world size.

    .venv/bin/python -m bench.reference.torchft_ref --workers 3 --fault kill --count 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from subprocess import Popen

from bench.fault_plan import Applied, Fault, FaultPlan, drive
from bench.figures import Commit, figures_of
from bench.reference.common import (
    ReferenceRunError, RunDirectory, commits_of, exit_on_sigterm, free_port, latest_holder,
    read_step_logs, worker_env, worker_threads,
)
from bench.reference.training import cache_corpus, check_workers


@dataclass(frozen=True)
class LighthouseConfig:
    # How long a quorum waits for members that heartbeat but have not asked to
    # join, counted from the first request. Below the step time it lets a late
    # replica miss every quorum: 200 ms made replicas alternate in pairs forever.
    join_timeout_ms: int = 1000
    # Silence after which a replica counts as dead (it heartbeats every 100 ms);
    # a quorum stops waiting for a dead member after min(join, heartbeat) timeout.
    heartbeat_timeout_ms: int = 1000
    quorum_tick_ms: int = 20  # how often a waiting quorum is re-checked

    def command(self, port: int, bind: str = "127.0.0.1") -> list[str]:
        binary = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent))
        if binary is None:
            raise ReferenceRunError("torchft_lighthouse not found next to this Python; "
                                    "install the bench extra: pip install -e '.[bench]'")
        return [binary, "--min_replicas", "1", "--join_timeout_ms", str(self.join_timeout_ms),
                "--heartbeat_timeout_ms", str(self.heartbeat_timeout_ms),
                "--quorum_tick_ms", str(self.quorum_tick_ms), "--bind", f"{bind}:{port}"]


class Replicas:
    """The lighthouse, one replica process per worker and a warm spare: a fault target."""

    def __init__(self, run: RunDirectory, job_path: str, corpus: Path, workers: int,
                 lighthouse: LighthouseConfig, timeout_s: float, warm_spare: bool = True) -> None:
        port = free_port()
        self.run, self.workers, self.warm_spare = run, workers, warm_spare
        self.launch_t = time.time()
        self.lighthouse = run.start(lighthouse.command(port), "lighthouse.log", worker_env())
        self.base = [sys.executable, "-m", "bench.reference.torchft_worker",
                     "--job", str(Path(job_path).resolve()), "--corpus", str(corpus),
                     "--run-dir", str(run.path), "--lighthouse", f"http://127.0.0.1:{port}",
                     "--threads", str(worker_threads(workers)), "--timeout-s", str(timeout_s)]
        (run.path / "spares").mkdir()
        self.started = 0  # replica processes started, for unique ids
        self.live: dict[str, Popen] = dict(self._start() for _ in range(workers))
        self.gone: set[str] = set()  # replicas a fault removed (their exit is expected)
        self.spare: tuple[str, Popen] | None = self._start(spare=True) if warm_spare else None

    def _start(self, spare: bool = False) -> tuple[str, Popen]:
        replica_id = f"replica{self.started}"
        self.started += 1
        extra = ["--wait-for", str(self._go_file(replica_id))] if spare else []
        process = self.run.start(self.base + ["--replica-id", replica_id] + extra,
                                 f"{replica_id}.log", worker_env())
        return replica_id, process

    def _go_file(self, replica_id: str) -> Path:
        return self.run.path / "spares" / f"{replica_id}.go"

    def healthy(self) -> None:
        if self.lighthouse.poll() is not None:
            raise ReferenceRunError(f"torchft lighthouse exited: {self.run.tail('lighthouse.log')}")
        for replica_id, process in list(self.live.items()) + ([self.spare] if self.spare else []):
            if process.poll() is not None and replica_id not in self.gone:
                raise ReferenceRunError(f"torchft {replica_id} exited with {process.returncode}: "
                                        f"{self.run.tail(f'{replica_id}.log')}")

    def holder(self, rank: int) -> str:
        replica_id = latest_holder(read_step_logs(self.run.logs), rank)
        if replica_id is None or replica_id not in self.live:
            raise ReferenceRunError(f"no live torchft replica holds rank {rank}")
        return replica_id

    def victim_pids(self, rank: int, whole_host: bool) -> list[int]:
        if whole_host:
            raise ValueError("host-kill needs hosts: run it with the namespaced placement")
        replica_id = self.holder(rank)
        self.last_victim = replica_id
        return [self.live[replica_id].pid]

    def partition(self, rank: int) -> None:
        raise ValueError("partition needs hosts: run it with the namespaced placement")

    def replace(self, k: int) -> None:
        victim = self.last_victim
        self.gone.add(victim)
        del self.live[victim]
        if self.spare is not None:
            self._go_file(self.spare[0]).touch()
            self.live[self.spare[0]] = self.spare[1]
            self.spare = self._start(spare=True)
        else:
            replica_id, process = self._start()
            self.live[replica_id] = process


def torchft_under_plan(job_path: str, plan: FaultPlan, *, warm_spare: bool = True,
                       lighthouse: LighthouseConfig = LighthouseConfig(),
                       timeout_s: float = 5.0) -> tuple[list[Commit], list[Applied], float]:
    """Run torchft replicas through `plan`; the commits every replica logged."""
    job = check_workers(job_path, plan.workers)
    with RunDirectory("torchft") as run:
        corpus = cache_corpus(job, run.path)
        target = Replicas(run, job_path, corpus, plan.workers, lighthouse, timeout_s, warm_spare)
        applied = drive(plan, target)
        return commits_of(read_step_logs(run.logs)), applied, target.launch_t


def torchft_fault_free(job_path: str, workers: int, duration_s: float,
                       lighthouse: LighthouseConfig = LighthouseConfig(),
                       timeout_s: float = 5.0) -> tuple[list[Commit], float]:
    """torchft replicas with no fault for `duration_s`: the full world's own rate."""
    job = check_workers(job_path, workers)
    with RunDirectory("torchft") as run:
        corpus = cache_corpus(job, run.path)
        target = Replicas(run, job_path, corpus, workers, lighthouse, timeout_s, warm_spare=False)
        while time.time() < target.launch_t + duration_s:
            target.healthy()
            time.sleep(0.2)
        return commits_of(read_step_logs(run.logs)), target.launch_t


def torchft_detection(lighthouse: LighthouseConfig, timeout_s: float) -> dict[str, float]:
    return {"lighthouse_join_timeout_s": lighthouse.join_timeout_ms / 1000,
            "lighthouse_heartbeat_timeout_s": lighthouse.heartbeat_timeout_ms / 1000,
            "heartbeat_every_s": 0.1, "collective_timeout_s": timeout_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="bench/elastic-gpt.toml")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--fault", type=Fault, default=Fault.kill)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--interval-s", type=float, default=15.0)
    parser.add_argument("--cold-respawn", action="store_true",
                        help="start each replacement after its fault instead of as a warm spare")
    parser.add_argument("--join-timeout-ms", type=int, default=LighthouseConfig.join_timeout_ms)
    parser.add_argument("--heartbeat-timeout-ms", type=int,
                        default=LighthouseConfig.heartbeat_timeout_ms)
    args = parser.parse_args()
    lighthouse = LighthouseConfig(args.join_timeout_ms, args.heartbeat_timeout_ms)
    plan = FaultPlan(args.fault, args.count, args.workers, interval_s=args.interval_s)
    exit_on_sigterm()
    commits, applied, launch_t = torchft_under_plan(args.job, plan, warm_spare=not args.cold_respawn,
                                                    lighthouse=lighthouse)
    print(json.dumps({"reference": "torchft", "plan": plan.describe(),
                      "detection": torchft_detection(lighthouse, 5.0),
                      "faults": [asdict(f) for f in figures_of(commits, applied, launch_t, plan)]}))


if __name__ == "__main__":
    main()
