"""torchft: per-step quorum through a lighthouse, live recovery from a peer.

One torchft replica group (one process) per worker, all on one lighthouse
(`torchft_lighthouse --min_replicas 1 --join_timeout_ms 200`: a quorum that
lost a member forms after 0.2 s instead of the 60 s default). Each replica
runs bench.reference.torchft_worker (Manager, synchronous quorum,
manager.allreduce on a flat gradient, OptimizerWrapper / should_commit). Every
`interval_s` one replica is SIGKILLed and a replacement starts at once; it
heals from a live peer over HTTP, which restores the world size.

Per kill: rto_s is shoal.train.recovery.recovery_s over the steps that started
between this kill and the next; steps_lost counts steps committed before the
kill that ran again after it (0 unless every replica died).

    .venv/bin/python -m bench.reference.torchft_ref --job bench/elastic-gpt.toml \\
        --workers 3 --kills 2 --interval-s 12
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from subprocess import Popen

from bench.reference.common import (
    FaultResult, ReferenceRunError, RunDirectory, exit_on_sigterm, fault_results, free_port,
    read_step_logs, worker_env, worker_threads,
)
from bench.reference.faults import KillSchedule, run_kills
from bench.reference.training import cache_corpus, check_workers

JOIN_TIMEOUT_MS = 200


def lighthouse_command(port: int) -> list[str]:
    binary = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent))
    if binary is None:
        raise ReferenceRunError("torchft_lighthouse not found next to this Python; "
                                "install the bench extra: pip install -e '.[bench]'")
    return [binary, "--min_replicas", "1", "--join_timeout_ms", str(JOIN_TIMEOUT_MS),
            "--bind", f"127.0.0.1:{port}"]


class Replicas:
    """The replica processes, one per slot; a killed slot gets a fresh replica id."""

    def __init__(self, run: RunDirectory, job_path: str, corpus: Path, lighthouse: str,
                 threads: int) -> None:
        self.run = run
        self.base = [sys.executable, "-m", "bench.reference.torchft_worker",
                     "--job", str(Path(job_path).resolve()), "--corpus", str(corpus),
                     "--run-dir", str(run.path), "--lighthouse", lighthouse,
                     "--threads", str(threads)]
        self.slots: list[Popen] = []
        self.generation: list[int] = []

    def start(self, slot: int) -> None:
        if slot == len(self.slots):
            self.slots.append(None)
            self.generation.append(0)
        else:
            self.generation[slot] += 1
        replica_id = f"r{slot}g{self.generation[slot]}"
        self.slots[slot] = self.run.start(self.base + ["--replica-id", replica_id],
                                          f"{replica_id}.log", worker_env())


def torchft_faults(job_path: str, workers: int, kills: int, interval_s: float) -> list[FaultResult]:
    """SIGKILL one torchft replica every `interval_s`, `kills` times, respawning each."""
    job = check_workers(job_path, workers)
    schedule = KillSchedule(kills, interval_s)
    with RunDirectory("torchft") as run:
        corpus = cache_corpus(job, run.path)
        port = free_port()
        launch_t = time.time()
        lighthouse = run.start(lighthouse_command(port), "lighthouse.log", worker_env())
        replicas = Replicas(run, job_path, corpus, f"http://127.0.0.1:{port}",
                            worker_threads(workers))
        for slot in range(workers):
            replicas.start(slot)

        def healthy() -> None:
            if lighthouse.poll() is not None:
                raise ReferenceRunError(f"torchft lighthouse exited: {run.tail('lighthouse.log')}")
            for slot, process in enumerate(replicas.slots):
                if process.poll() is not None:
                    log = f"r{slot}g{replicas.generation[slot]}.log"
                    raise ReferenceRunError(f"torchft replica {slot} exited with "
                                            f"{process.returncode}: {run.tail(log)}")

        def victim_pid(k: int) -> int:
            return replicas.slots[k % workers].pid

        def respawn(k: int) -> None:
            replicas.slots[k % workers].wait()
            replicas.start(k % workers)

        fault_times = run_kills(run, schedule, victim_pid, respawn, healthy)
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
    results = torchft_faults(args.job, args.workers, args.kills, args.interval_s)
    print(json.dumps({
        "reference": "torchft", "workers": args.workers,
        "faults": [r.as_dict() for r in results],
        "wall_s": round(time.monotonic() - started, 1),
    }))


if __name__ == "__main__":
    main()
