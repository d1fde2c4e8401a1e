"""`shoal run`: start N worker processes around one membership authority,
inject scheduled faults, and write the run's report.

The launcher hosts the rendezvous store and the authority, so a worker's
death never takes them down; it tells the authority at once when a worker
process exits (faster than any heartbeat).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.spec.elastic import ElasticReport, FaultKind
from shoal.control.authority import AuthorityConfig, MembershipAuthority
from shoal.control.chaos import ChaosEvent
from shoal.control.elastic_report import FaultEvent, build_report
from shoal.control.errors import ControlError
from shoal.train.rendezvous import Rendezvous, connect

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0
SUPERVISE_EVERY_S = 0.02  # chaos timing and completion checks; the authority does not wait on it


@dataclass(frozen=True)
class LaunchConfig:
    command: list[str]  # the worker program, e.g. [python, script.py, args...]
    workers: int
    run_dir: Path
    chaos: list[ChaosEvent] = field(default_factory=list)
    stall_s: float = 5.0  # how long a `stall` keeps the worker stopped
    stall_deadline_s: float = 3.0  # heartbeat silence after which a worker is dropped
    env: dict[str, str] = field(default_factory=dict)  # extra SHOAL_* settings for every worker
    worker_env: dict[int, dict[str, str]] = field(default_factory=dict)  # per launch index
    timeout_s: float = 3600.0
    host: str = "127.0.0.1"
    # Warm spares: started and ready (torch imported, model built) but idle until a
    # `join` calls one in, so a join costs a state transfer, not a process start.
    spares: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ControlError("--workers must be at least 1")
        if self.spares < 0:
            raise ControlError("--spares cannot be negative")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class Launcher:
    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.port = free_port(config.host)
        config.run_dir.mkdir(parents=True, exist_ok=True)
        self.store = connect(config.host, self.port, is_master=True)
        self.rdzv = Rendezvous(self.store)
        self.processes: dict[str, subprocess.Popen] = {}
        self.faults: list[FaultEvent] = []
        self._stalled: dict[str, float] = {}
        self._spares: list[str] = []  # warm spares not yet called in, oldest first
        self._pending = list(config.chaos)
        self.authority = MembershipAuthority(
            self.rdzv,
            AuthorityConfig(min_workers=config.workers, stall_deadline_s=config.stall_deadline_s),
            process_alive=self._process_alive,
            event_log=config.run_dir / "epochs.jsonl",
        )

    def _process_alive(self, worker: str) -> bool | None:
        process = self.processes.get(worker)
        return None if process is None else process.poll() is None

    def spawn(self, index: int, spare: bool = False) -> str:
        worker = f"w{index}"
        env = {**os.environ, **self.config.env, **self.config.worker_env.get(index, {}),
               **({"SHOAL_SPARE": "1"} if spare else {}),
               "SHOAL_RENDEZVOUS": f"{self.config.host}:{self.port}",
               "SHOAL_WORKER": worker, "SHOAL_RUN_DIR": str(self.config.run_dir),
               "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
        # Like torchrun: without a cap, every worker starts one OpenMP thread per core, and
        # oversubscribed spinning threads make each step many times slower.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.config.workers)))
        output = open(self.config.run_dir / f"{worker}.log", "ab")
        process = subprocess.Popen(self.config.command, env=env, stdout=output, stderr=subprocess.STDOUT)
        output.close()
        self.processes[worker] = process
        if spare:
            self._spares.append(worker)
        # The authority learns of an exit the moment it happens, with no polling.
        threading.Thread(target=self._watch_exit, args=(process,), name=f"exit-{worker}",
                         daemon=True).start()
        return worker

    def _watch_exit(self, process: subprocess.Popen) -> None:
        process.wait()
        self.authority.notify()

    def run(self) -> ElasticReport:
        started = time.time()
        (self.config.run_dir / "launch.json").write_text(json.dumps({"t0": started}))
        self.authority.start(watch_requests=Rendezvous(connect(self.config.host, self.port)))
        for index in range(self.config.workers):
            self.spawn(index)
        for _ in range(self.config.spares):
            self.spawn(len(self.processes), spare=True)
        try:
            self._supervise(started)
        finally:
            self._shutdown()
        members = self.authority.members
        speeds = {w: s for w, s in zip(members, self.rdzv.speeds(members)) if s}
        return build_report(self.config.run_dir, self.faults, started,
                            final=self.rdzv.final() if self.rdzv.done() else {}, speeds=speeds)

    def _supervise(self, started: float) -> None:
        deadline = started + self.config.timeout_s
        next_note = started + PROGRESS_EVERY_S
        while not self.rdzv.done():
            now = time.time()
            if now >= next_note:
                next_note = now + PROGRESS_EVERY_S
                log.info("step %d, epoch %d, %d workers", self.rdzv.progress(),
                         self.authority.epoch, len(self.authority.members))
            if now > deadline:
                raise ControlError(f"run did not finish within {self.config.timeout_s:.0f} s; "
                                 f"worker logs are in {self.config.run_dir}")
            self._inject_due(now - started)
            self._wake_stalled(now)
            if not self._any_alive() and not self._joins_ahead():
                raise ControlError("every worker exited before the job finished; see "
                                 f"{self.config.run_dir}/w*.log (resume from checkpoints "
                                 "with the same job and --resume)")
            time.sleep(SUPERVISE_EVERY_S)
        self.authority.stop()  # workers exiting at the end are not faults
        self._wait_for_exit(grace_s=60.0)

    def _inject_due(self, elapsed_s: float) -> None:
        if not self._pending:
            return
        by_step = any(e.at_step is not None for e in self._pending)
        step = self.rdzv.progress() if by_step else 0
        for event in [e for e in self._pending if e.due(elapsed_s, step)]:
            self._pending.remove(event)
            self._inject(event, elapsed_s)

    def _inject(self, event: ChaosEvent, elapsed_s: float) -> None:
        if event.kind is FaultKind.join:
            worker = self._join_one()
            self.faults.append(FaultEvent(event.kind, worker, time.time()))
            log.info("chaos %s: %s joins", event, worker)
            return
        worker = self._target(event)
        if worker is None:
            log.warning("chaos %s: no live worker to target; skipped", event)
            return
        process = self.processes[worker]
        signum = {FaultKind.kill: signal.SIGKILL, FaultKind.stall: signal.SIGSTOP,
                  FaultKind.leave: signal.SIGTERM}[event.kind]
        self.faults.append(FaultEvent(event.kind, worker, time.time()))
        process.send_signal(signum)
        if event.kind is FaultKind.stall:
            self._stalled[worker] = time.time() + self.config.stall_s
        log.info("chaos %s: %s %s at %.1f s", event, signal.Signals(signum).name, worker, elapsed_s)

    def _join_one(self) -> str:
        """Call in a warm spare (and start another in its place), or start a new worker."""
        while self._spares:
            spare = self._spares.pop(0)
            if self.processes[spare].poll() is None:
                self.rdzv.activate(spare)
                self.spawn(len(self.processes), spare=True)
                return spare
        return self.spawn(len(self.processes))

    def _target(self, event: ChaosEvent) -> str | None:
        if event.worker is not None:
            worker = f"w{event.worker}"
            alive = worker in self.processes and self.processes[worker].poll() is None
            return worker if alive else None
        alive = [w for w, p in self.processes.items()
                 if p.poll() is None and w not in self._stalled and w not in self._spares]
        return alive[-1] if alive else None

    def _wake_stalled(self, now: float) -> None:
        for worker, wake_at in list(self._stalled.items()):
            if now >= wake_at:
                del self._stalled[worker]
                if self.processes[worker].poll() is None:
                    self.processes[worker].send_signal(signal.SIGCONT)

    def _any_alive(self) -> bool:
        return any(p.poll() is None for w, p in self.processes.items() if w not in self._spares)

    def _joins_ahead(self) -> bool:
        return any(e.kind is FaultKind.join for e in self._pending)

    def _wait_for_exit(self, grace_s: float) -> None:
        for worker in list(self._stalled):
            self.processes[worker].send_signal(signal.SIGCONT)
        self._stalled.clear()
        end = time.time() + grace_s
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                pass

    def _shutdown(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
        self.authority.stop()


def worker_command(script: str, args: list[str]) -> list[str]:
    return [sys.executable, script, *args]
