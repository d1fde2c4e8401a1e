"""torchft: per-step quorum through a lighthouse, live recovery from a peer.

One torchft replica group (one process) per worker, all on one lighthouse with
--min_replicas 1 and join/heartbeat timeouts of 1 s (LighthouseConfig says why
not the 200 ms of NOTES: below the step time, replicas fell into alternating
pairs). Each replica runs bench.reference.torchft_worker (Manager, synchronous
quorum, manager.allreduce on a flat gradient, OptimizerWrapper / should_commit).
Every `interval_s` one replica is SIGKILLed and a replacement joins at once; it
heals from a live peer over HTTP, which restores the world size.

The replacement is a warm spare by default: started (torch imported, model
built) after the previous fault's recovery is measured and before this kill,
it contacts the lighthouse only after the kill. On a cluster it would start on
a machine of its own; here, started after the kill, its 5-9 s of Python and
torch start-up take the two cores from the survivors, and recovery_s's steady
window then lands on slowed steps or not, so RTOs swung between 0.5 and 8 s
(shoal's joiners are warm spares too). --cold-respawn measures that case anyway.

Per kill: rto_s is shoal.control.recovery.recovery_s over the steps that started
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
from dataclasses import asdict, dataclass
from pathlib import Path
from subprocess import Popen

from bench.reference.common import (
    FaultResult, ReferenceRunError, RunDirectory, exit_on_sigterm, fault_results, free_port,
    read_step_logs, wait_until, worker_env, worker_threads,
)
from bench.reference.faults import KillSchedule, run_kills
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

    def command(self, port: int) -> list[str]:
        binary = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent))
        if binary is None:
            raise ReferenceRunError("torchft_lighthouse not found next to this Python; "
                                    "install the bench extra: pip install -e '.[bench]'")
        return [binary, "--min_replicas", "1", "--join_timeout_ms", str(self.join_timeout_ms),
                "--heartbeat_timeout_ms", str(self.heartbeat_timeout_ms),
                "--quorum_tick_ms", str(self.quorum_tick_ms), "--bind", f"127.0.0.1:{port}"]


class Replicas:
    """The lighthouse and one replica process per slot; the kill loop's FaultTarget.

    A killed slot is refilled by a replica with a fresh id: a warm spare that was
    started (torch imported, model built) before the kill and is released right
    after it, or, with warm_spare=False, a process started after the kill.
    """

    def __init__(self, run: RunDirectory, job_path: str, corpus: Path, workers: int,
                 warm_spare: bool, lighthouse: LighthouseConfig) -> None:
        port = free_port()
        self.run, self.workers, self.warm_spare = run, workers, warm_spare
        self.lighthouse = run.start(lighthouse.command(port), "lighthouse.log", worker_env())
        self.base = [sys.executable, "-m", "bench.reference.torchft_worker",
                     "--job", str(Path(job_path).resolve()), "--corpus", str(corpus),
                     "--run-dir", str(run.path), "--lighthouse", f"http://127.0.0.1:{port}",
                     "--threads", str(worker_threads(workers))]
        (run.path / "spares").mkdir()
        self.started = 0  # replica processes started, for unique ids
        self.slots: list[tuple[str, Popen]] = [self._start() for _ in range(workers)]
        self.spare: tuple[str, Popen] | None = None

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
        for replica_id, process in self.slots + ([self.spare] if self.spare else []):
            if process.poll() is not None:
                raise ReferenceRunError(f"torchft {replica_id} exited with {process.returncode}: "
                                        f"{self.run.tail(f'{replica_id}.log')}")

    def prepare_kill(self, k: int) -> None:
        if not self.warm_spare:
            return
        self.spare = self._start(spare=True)
        ready = self._go_file(self.spare[0]).with_suffix(".ready")
        wait_until(ready.exists, 120.0, f"spare {self.spare[0]} to start")

    def victim_pid(self, k: int) -> int:
        return self.slots[k % self.workers][1].pid

    def after_kill(self, k: int) -> None:
        slot = k % self.workers
        self.slots[slot][1].wait()
        if self.spare is not None:
            self._go_file(self.spare[0]).touch()
            self.slots[slot], self.spare = self.spare, None
        else:
            self.slots[slot] = self._start()


def torchft_faults(job_path: str, workers: int, kills: int, interval_s: float, *,
                   warm_spare: bool = True,
                   lighthouse: LighthouseConfig = LighthouseConfig()) -> list[FaultResult]:
    """SIGKILL one torchft replica every `interval_s`, `kills` times, replacing each."""
    job = check_workers(job_path, workers)
    schedule = KillSchedule(kills, interval_s)
    with RunDirectory("torchft") as run:
        corpus = cache_corpus(job, run.path)
        launch_t = time.time()
        fault_times = run_kills(run, schedule, Replicas(run, job_path, corpus, workers, warm_spare,
                                                          lighthouse))
        return fault_results(read_step_logs(run.logs), fault_times, launch_t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="bench/elastic-gpt.toml")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--interval-s", type=float, default=12.0)
    parser.add_argument("--cold-respawn", action="store_true",
                        help="start each replacement after its kill instead of as a warm spare")
    parser.add_argument("--join-timeout-ms", type=int, default=LighthouseConfig.join_timeout_ms)
    parser.add_argument("--heartbeat-timeout-ms", type=int,
                        default=LighthouseConfig.heartbeat_timeout_ms)
    args = parser.parse_args()
    lighthouse = LighthouseConfig(args.join_timeout_ms, args.heartbeat_timeout_ms)
    exit_on_sigterm()
    started = time.monotonic()
    results = torchft_faults(args.job, args.workers, args.kills, args.interval_s,
                             warm_spare=not args.cold_respawn, lighthouse=lighthouse)
    print(json.dumps({
        "reference": "torchft", "workers": args.workers, "warm_spare": not args.cold_respawn,
        "lighthouse": asdict(lighthouse),
        "faults": [r.as_dict() for r in results],
        "wall_s": round(time.monotonic() - started, 1),
    }))


if __name__ == "__main__":
    main()
