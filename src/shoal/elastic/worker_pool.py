"""This host's workers as its launcher holds them: started with their
environment, hit by the chaos schedule, asked to leave on SIGTERM, and
killed whole at the end. Knows nothing of the store beyond a callback."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

from shoal.elastic.chaos import ChaosEvent
from shoal.elastic.report import FaultEvent
from shoal.elastic.launch_config import LaunchConfig
from shoal.elastic.worker_process import WorkerProcess
from shoal.spec.elastic import FaultKind
from shoal.train.run_config import RunConfig, without_run_config

log = logging.getLogger(__name__)


SPARE_NICENESS = 10


class WorkerPool:
    def __init__(self, config: LaunchConfig, node: str, rendezvous: str, env: dict[str, str],
                 on_exit: Callable[[str], None], activate: Callable[[str], None]) -> None:
        self.config = config
        self.node = node  # "" on one host: ids are w<i>
        self.rendezvous = rendezvous  # HOST:PORT, as this host's workers reach the store
        self.env = env  # every worker's environment beyond the launcher's own
        self.on_exit = on_exit
        self.activate = activate  # calls a warm spare in
        self.workers: dict[str, WorkerProcess] = {}
        self.spares: list[str] = []  # warm spares not yet called in, oldest first
        self._stalled: dict[str, float] = {}

    def worker_id(self, index: int) -> str:
        return f"{self.node}-w{index}" if self.node else f"w{index}"

    def spawn(self, index: int, spare: bool = False) -> str:
        worker = self.worker_id(index)
        config = self.config
        env = {**without_run_config(os.environ), **self.env, **config.worker_env.get(index, {})}
        run = RunConfig.launched(self.rendezvous, worker, config.run_dir, spare,
                                 config.settings_of(index))
        env.update(run.to_env(), LOCAL_RANK=str(index), LOCAL_WORLD_SIZE=str(config.workers))
        # Like torchrun: without a cap, every worker starts one OpenMP thread per core, and
        # oversubscribed spinning threads make each step many times slower.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // config.workers)))
        # A spare starts at low priority: on a machine it shares with training, its start-up
        # (importing torch, building the model) must not slow the job it stands by for.
        self.workers[worker] = WorkerProcess(worker, config.command, env,
                                             config.run_dir / f"{worker}.log", self.on_exit,
                                             niceness=SPARE_NICENESS if spare else 0,
                                             preloaded=True)
        if spare:
            self.spares.append(worker)
        return worker

    def start(self) -> None:
        for index in range(self.config.workers):
            self.spawn(index)
        for _ in range(self.config.spares):
            self.spawn(len(self.workers), spare=True)

    def alive(self, worker: str) -> bool | None:
        """True/False for this host's workers; None for anyone else's."""
        process = self.workers.get(worker)
        return None if process is None else process.alive()

    def alive_count(self) -> int:
        return sum(1 for w, p in self.workers.items() if p.alive() and w not in self.spares)

    # -- chaos -----------------------------------------------------------

    def inject(self, event: ChaosEvent, elapsed_s: float) -> FaultEvent | None:
        now = time.time()  # before acting: the authority may answer before we return
        if event.kind is FaultKind.join:
            worker = self._join_one()
            log.info("chaos %s: %s joins", event, worker)
            return FaultEvent(event.kind, worker, now)
        worker = self._target(event)
        if worker is None:
            log.warning("chaos %s: no live worker to target; skipped", event)
            return None
        fault = FaultEvent(event.kind, worker, now)
        process = self.workers[worker]
        if event.kind is FaultKind.kill:
            process.kill()
        elif event.kind is FaultKind.stall:
            process.signal(signal.SIGSTOP)
            self._stalled[worker] = time.time() + self.config.stall_s
        else:
            process.signal(signal.SIGTERM)  # a spot notice: hand over, then leave
        log.info("chaos %s: %s at %.1f s", event, worker, elapsed_s)
        return fault

    def _join_one(self) -> str:
        """Call in a warm spare (and start another in its place), or start a new worker."""
        while self.spares:
            spare = self.spares.pop(0)
            if self.workers[spare].alive():
                self.workers[spare].renice(0)  # a member now: full priority
                self.activate(spare)
                self.spawn(len(self.workers), spare=True)
                return spare
        return self.spawn(len(self.workers))

    def _target(self, event: ChaosEvent) -> str | None:
        if event.worker is not None:
            worker = self.worker_id(event.worker)
            return worker if worker in self.workers and self.workers[worker].alive() else None
        alive = [w for w, p in self.workers.items()
                 if p.alive() and w not in self._stalled and w not in self.spares]
        return alive[-1] if alive else None

    def wake_stalled(self, now: float) -> None:
        for worker, wake_at in list(self._stalled.items()):
            if now >= wake_at:
                del self._stalled[worker]
                self.workers[worker].signal(signal.SIGCONT)

    def resume_stalled(self) -> None:
        for worker in self._stalled:
            self.workers[worker].signal(signal.SIGCONT)
        self._stalled.clear()

    # -- ending ----------------------------------------------------------

    def leave_gracefully(self, grace_s: float) -> tuple[int, int]:
        """SIGTERM every member, the first one last: on one host it is then alone and writes
        the last checkpoint; across hosts it hands over to the other hosts' workers. The
        others get half the grace period, the last one the rest. Returns (left, killed)."""
        start = time.monotonic()
        self.resume_stalled()
        for spare in self.spares:  # a spare holds no state
            self.workers[spare].kill()
        members = [p for w, p in self.workers.items() if p.alive() and w not in self.spares]
        killed = (_leave(members[1:], until=start + grace_s / 2)
                  + _leave(members[:1], until=start + grace_s))
        return len(members) - killed, killed

    def wait_for_exit(self, grace_s: float) -> None:
        self.resume_stalled()
        end = time.monotonic() + grace_s
        for process in self.workers.values():
            process.wait(max(0.1, end - time.monotonic()))

    def kill_all(self) -> None:
        """Kill what is left and join every exit watcher."""
        self.resume_stalled()
        for process in self.workers.values():
            if process.alive():
                process.kill()
        for process in self.workers.values():
            process.join_watcher(5.0)


def _leave(wave: list[WorkerProcess], until: float) -> int:
    """Ask `wave` to leave; kill whoever is still there at `until`. Returns how many."""
    for process in wave:
        process.signal(signal.SIGTERM)
    for process in wave:
        process.wait(until - time.monotonic())
    stubborn = [p for p in wave if p.alive()]
    for process in stubborn:
        log.warning("%s did not leave within the grace period; killed", process.worker)
        process.kill()
    return len(stubborn)
