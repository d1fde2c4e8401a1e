"""`shoal run`: start this host's workers, supervise them, stop when the job is done.

One launcher runs on every host. The serving one (the only one on a single
host) also hosts the rendezvous store and the membership authority, so a
worker's death never takes them down, and writes the run's report. Every
launcher tells the authority through the store the moment one of its
workers exits (faster than any liveness deadline), runs its own chaos
schedule on its own workers, and on SIGTERM asks them to leave gracefully.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from shoal.control.authority import AuthorityConfig
from shoal.control.chaos import ChaosEvent
from shoal.control.elastic_report import FaultEvent, build_report
from shoal.control.errors import ControlError
from shoal.control.liveness import LivenessConfig
from shoal.control.netaddr import interface_of, parse_endpoint, worker_address
from shoal.control.serve import RendezvousServer
from shoal.control.worker_process import WorkerProcess
from shoal.spec.elastic import ElasticReport, FaultKind
from shoal.train.rendezvous import Rendezvous, connect

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0
SUPERVISE_EVERY_S = 0.02  # chaos timing and completion checks; the authority does not wait on it
FINISH_GRACE_S = 60.0  # once the job is done, how long workers get to exit on their own
LINGER_S = 15.0  # the serving host keeps the store up until other hosts' workers exit, at most this
EMPTY_JOB_S = 60.0  # the serving host gives up after this long with no worker on any host


@dataclass(frozen=True)
class LaunchConfig:
    command: list[str]  # the worker program, e.g. [python, script.py, args...]
    workers: int  # on this host
    run_dir: Path
    chaos: list[ChaosEvent] = field(default_factory=list)  # on this host's workers
    stall_s: float = 5.0  # how long a `stall` keeps the worker stopped
    stall_deadline_s: float = 1.0  # least time a member may fall behind its peers before it is fenced
    env: dict[str, str] = field(default_factory=dict)  # extra SHOAL_* settings for every worker
    worker_env: dict[int, dict[str, str]] = field(default_factory=dict)  # per launch index
    timeout_s: float = 3600.0
    # Warm spares: started and ready (torch imported, model built) but idle until a
    # `join` calls one in, so a join costs a state transfer, not a process start.
    spares: int = 0
    # Across hosts, every launcher names the same rendezvous and one of them serves it.
    rendezvous: str | None = None  # HOST:PORT; None: one host, served here on a free port
    serve: bool = False  # host the store and the authority (implied on one host)
    # Where the store listens (serving) and the address this host's workers give their
    # peers. Default: 127.0.0.1 on one host; across hosts the rendezvous host when
    # serving, else the local address that reaches it.
    bind: str | None = None
    node: str = ""  # across hosts, worker ids are NODE-w<i> (default: the hostname)
    min_workers: int | None = None  # first epoch, all hosts together (serving; default: workers)
    grace_s: float = 30.0  # on SIGTERM, how long workers get to hand over before they are killed

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ControlError("--workers must be at least 1")
        if self.spares < 0:
            raise ControlError("--spares cannot be negative")
        if self.rendezvous is not None:
            parse_endpoint(self.rendezvous)
        elif self.serve or self.node:
            raise ControlError("--serve and --node need --rendezvous HOST:PORT")
        if self.min_workers is not None and (self.min_workers < 1 or not self.serves):
            raise ControlError("--min-workers is for the serving host and must be at least 1")
        if self.grace_s < 0:
            raise ControlError("--grace-s cannot be negative")

    @property
    def serves(self) -> bool:
        return self.rendezvous is None or self.serve


class Launcher:
    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        config.run_dir.mkdir(parents=True, exist_ok=True)
        self.server: RendezvousServer | None = None
        self.workers: dict[str, WorkerProcess] = {}
        self.faults: list[FaultEvent] = []
        self._stalled: dict[str, float] = {}
        self._spares: list[str] = []  # warm spares not yet called in, oldest first
        self._pending = list(config.chaos)
        self._sigterm = threading.Event()
        self._empty_since: float | None = None
        try:
            self.rdzv, self.endpoint = self._open_rendezvous()
            self.node = self._claim_node() if config.rendezvous else ""
            self._network_env = self._gloo_env()
        except BaseException:
            self._close_rendezvous()
            raise

    # -- the rendezvous: served here or reached --------------------------

    def _open_rendezvous(self) -> tuple[Rendezvous, str]:
        config = self.config
        if config.rendezvous is None:
            bind = config.bind or "127.0.0.1"
            self.server = RendezvousServer(bind)
            client = "127.0.0.1" if bind in ("0.0.0.0", "") else bind
            return self.server.rdzv, f"{client}:{self.server.port}"
        host, port = parse_endpoint(config.rendezvous)
        if config.serve:
            self.server = RendezvousServer(config.bind or host, port)
            return self.server.rdzv, config.rendezvous
        return Rendezvous(connect(host, port)), config.rendezvous

    def _claim_node(self) -> str:
        """This host's name in worker ids; a name already taken in this job (two hosts with
        one hostname, or a restarted host) gets a suffix, so ids never repeat."""
        node = self.config.node or socket.gethostname()
        claims = self.rdzv.store.add(f"launcher/node/{node}", 1)
        if claims == 1:
            return node
        log.warning("node name %r is already in this job; this host's workers are %s.%d-w<i>",
                    node, node, claims)
        return f"{node}.{claims}"

    def _gloo_env(self) -> dict[str, str]:
        """Across hosts, gloo must bind the interface that peers can reach (it guesses
        from the hostname otherwise, which in general they cannot)."""
        if self.config.rendezvous is None:
            return {}
        address = worker_address(self.config.bind or "", parse_endpoint(self.config.rendezvous))
        interface = interface_of(address)
        if interface is None:
            raise ControlError(f"--bind {address} is not an address of this host")
        log.info("workers on %s use %s (%s); rendezvous %s", self.node, address, interface,
                 self.endpoint)
        return {"GLOO_SOCKET_IFNAME": interface}

    def _close_rendezvous(self) -> None:
        if self.server is not None:
            self.server.close()
        self.server = None
        self.rdzv = None  # type: ignore[assignment]  # the last reference closes a client

    # -- workers ---------------------------------------------------------

    def worker_id(self, index: int) -> str:
        return f"{self.node}-w{index}" if self.node else f"w{index}"

    def spawn(self, index: int, spare: bool = False) -> str:
        worker = self.worker_id(index)
        config = self.config
        env = {**self._network_env, **os.environ, **config.env, **config.worker_env.get(index, {}),
               **({"SHOAL_SPARE": "1"} if spare else {}),
               "SHOAL_RENDEZVOUS": self.endpoint, "SHOAL_WORKER": worker,
               "SHOAL_RUN_DIR": str(config.run_dir),
               "LOCAL_RANK": str(index), "LOCAL_WORLD_SIZE": str(config.workers),
               "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
        # Like torchrun: without a cap, every worker starts one OpenMP thread per core, and
        # oversubscribed spinning threads make each step many times slower.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // config.workers)))
        self.workers[worker] = WorkerProcess(worker, config.command, env,
                                             config.run_dir / f"{worker}.log", self._on_exit)
        if spare:
            self._spares.append(worker)
        return worker

    def _on_exit(self, worker: str) -> None:
        """Runs in the worker's exit watcher: every host's authority learns of it at once."""
        log.debug("%s exited with status %s", worker, self.workers[worker].process.returncode)
        if self.server is not None and self.server.authority is not None:
            self.server.authority.notify()
        rdzv = self.rdzv
        if rdzv is not None:
            rdzv.report_exit(worker)

    def _process_alive(self, worker: str) -> bool | None:
        process = self.workers.get(worker)
        return None if process is None else process.alive()

    # -- the run ---------------------------------------------------------

    def run(self) -> ElasticReport | None:
        """Supervise until the job is done; the serving launcher returns the run's report."""
        started = time.time()
        if self.server is not None:
            (self.config.run_dir / "launch.json").write_text(json.dumps({"t0": started}))
            self.server.start_authority(
                AuthorityConfig(min_workers=self.config.min_workers or self.config.workers,
                                liveness=LivenessConfig(floor_s=self.config.stall_deadline_s)),
                process_alive=self._process_alive, event_log=self.config.run_dir / "epochs.jsonl")
        previous = self._catch_sigterm()
        try:
            for index in range(self.config.workers):
                self.spawn(index)
            for _ in range(self.config.spares):
                self.spawn(len(self.workers), spare=True)
            self._supervise(started)
            return self._report(started) if self.server is not None else None
        finally:
            self._shutdown()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _catch_sigterm(self) -> signal.Handlers | object | None:
        if threading.current_thread() is not threading.main_thread():
            return None  # only the main thread may set handlers; the caller handles signals
        return signal.signal(signal.SIGTERM, lambda *_: self._sigterm.set())

    def _supervise(self, started: float) -> None:
        deadline = started + self.config.timeout_s
        next_note = started + PROGRESS_EVERY_S
        while not self._job_done():
            now = time.time()
            if self._sigterm.is_set():
                self._leave_on_sigterm()
            if now >= next_note:
                next_note = now + PROGRESS_EVERY_S
                self._log_progress()
            if now > deadline:
                raise ControlError(f"run did not finish within {self.config.timeout_s:.0f} s; "
                                   f"worker logs are in {self.config.run_dir}")
            self._inject_due(now - started)
            self._wake_stalled(now)
            self._check_workers_left(now)
            time.sleep(SUPERVISE_EVERY_S)
        if self.server is not None:
            self.server.stop_authority()  # workers exiting at the end are not faults
        self._wait_for_exit(FINISH_GRACE_S)
        log.debug("job done; this host's workers exited")
        if self.server is not None and self.config.rendezvous is not None:
            self._linger_for_other_hosts()
            log.debug("other hosts' workers exited")
        failure = self.rdzv.failure()
        if failure:
            raise ControlError(f"the membership authority gave the run up: {failure}")

    def _job_done(self) -> bool:
        try:
            return self.rdzv.done()
        except RuntimeError as error:  # c10d's store errors are RuntimeErrors
            raise ControlError(f"lost the rendezvous store at {self.endpoint} ({str(error)[:120]}); "
                               "the serving host is gone or unreachable, so this host's workers "
                               "are stopped") from None

    def _log_progress(self) -> None:
        authority = self.server.authority if self.server is not None else None
        if authority is not None:
            log.info("step %d, epoch %d, %d workers", self.rdzv.progress(), authority.epoch,
                     len(authority.members))
        else:
            log.info("step %d; %d workers here", self.rdzv.progress(), self._alive_count())

    def _check_workers_left(self, now: float) -> None:
        if self._alive_count() or self._joins_ahead():
            self._empty_since = None
            return
        if self.config.rendezvous is None:
            raise ControlError("every worker exited before the job finished; see "
                               f"{self.config.run_dir}/w*.log (resume from checkpoints "
                               "with the same job and --resume)")
        if self.server is None:
            raise ControlError(f"every worker on {self.node} exited before the job finished; "
                               f"see {self.config.run_dir}/{self.node}-w*.log")
        # The serving host keeps the store up while other hosts' workers train.
        authority = self.server.authority
        if authority is not None and authority.members:
            self._empty_since = None
            return
        self._empty_since = self._empty_since or now
        if now - self._empty_since > EMPTY_JOB_S:
            raise ControlError(f"no worker on any host for {EMPTY_JOB_S:.0f} s; giving the job up")

    def _alive_count(self) -> int:
        return sum(1 for w, p in self.workers.items() if p.alive() and w not in self._spares)

    def _joins_ahead(self) -> bool:
        return any(e.kind is FaultKind.join for e in self._pending)

    # -- chaos -----------------------------------------------------------

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
        self.faults.append(FaultEvent(event.kind, worker, time.time()))
        process = self.workers[worker]
        if event.kind is FaultKind.kill:
            process.kill()
        elif event.kind is FaultKind.stall:
            process.signal(signal.SIGSTOP)
            self._stalled[worker] = time.time() + self.config.stall_s
        else:
            process.signal(signal.SIGTERM)  # a spot notice: hand over, then leave
        log.info("chaos %s: %s at %.1f s", event, worker, elapsed_s)

    def _join_one(self) -> str:
        """Call in a warm spare (and start another in its place), or start a new worker."""
        while self._spares:
            spare = self._spares.pop(0)
            if self.workers[spare].alive():
                self.rdzv.activate(spare)
                self.spawn(len(self.workers), spare=True)
                return spare
        return self.spawn(len(self.workers))

    def _target(self, event: ChaosEvent) -> str | None:
        if event.worker is not None:
            worker = self.worker_id(event.worker)
            return worker if worker in self.workers and self.workers[worker].alive() else None
        alive = [w for w, p in self.workers.items()
                 if p.alive() and w not in self._stalled and w not in self._spares]
        return alive[-1] if alive else None

    def _wake_stalled(self, now: float) -> None:
        for worker, wake_at in list(self._stalled.items()):
            if now >= wake_at:
                del self._stalled[worker]
                self.workers[worker].signal(signal.SIGCONT)

    # -- ending ----------------------------------------------------------

    def _leave_on_sigterm(self) -> NoReturn:
        grace = self.config.grace_s
        log.warning("SIGTERM: asking this host's workers to leave (%.0f s grace)", grace)
        left, killed = self._leave_gracefully(grace)
        raise ControlError(
            f"stopped by SIGTERM: {left} worker(s) handed over and left, {killed} killed after "
            f"the {grace:.0f} s grace period" + ("; resume from checkpoints with --resume"
                                                 if self.config.rendezvous is None else ""))

    def _leave_gracefully(self, grace_s: float) -> tuple[int, int]:
        """SIGTERM every member, the first one last: on one host it is then alone and writes
        the last checkpoint; across hosts it hands over to the other hosts' workers. The
        others get half the grace period, the last one the rest."""
        start = time.monotonic()
        self._resume_stalled()
        for spare in self._spares:  # a spare holds no state
            self.workers[spare].kill()
        members = [p for w, p in self.workers.items() if p.alive() and w not in self._spares]
        killed = (self._leave(members[1:], until=start + grace_s / 2)
                  + self._leave(members[:1], until=start + grace_s))
        return len(members) - killed, killed

    @staticmethod
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

    def _resume_stalled(self) -> None:
        for worker in self._stalled:
            self.workers[worker].signal(signal.SIGCONT)
        self._stalled.clear()

    def _wait_for_exit(self, grace_s: float) -> None:
        self._resume_stalled()
        end = time.monotonic() + grace_s
        for process in self.workers.values():
            process.wait(max(0.1, end - time.monotonic()))

    def _linger_for_other_hosts(self) -> None:
        """Keep the store up until the other hosts' workers are gone (they may still read it)."""
        assert self.server is not None and self.server.authority is not None
        remote = [m for m in self.server.authority.members if m not in self.workers]
        end = time.monotonic() + LINGER_S
        while remote and time.monotonic() < end:
            remote = [m for m in remote if m not in self.rdzv.exited(remote)]
            time.sleep(0.05)

    def _report(self, started: float) -> ElasticReport:
        assert self.server is not None and self.server.authority is not None
        members = self.server.authority.members
        speeds = {w: s for w, s in zip(members, self.rdzv.speeds(members)) if s}
        return build_report(self.config.run_dir, self.faults, started,
                            final=self.rdzv.final() if self.rdzv.done() else {}, speeds=speeds)

    def _shutdown(self) -> None:
        """Kill what is left, join every thread this launcher started, close the store."""
        self._resume_stalled()
        for process in self.workers.values():
            if process.alive():
                process.kill()
        for process in self.workers.values():
            process.join_watcher(5.0)
        self._close_rendezvous()
        log.debug("launcher closed")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now, for tests that host a store without a launcher (racy by
    nature: the launcher itself lets its store bind port 0)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def worker_command(script: str, args: list[str]) -> list[str]:
    return [sys.executable, script, *args]
