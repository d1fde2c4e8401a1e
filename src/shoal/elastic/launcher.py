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
from pathlib import Path
from typing import NoReturn

from shoal.elastic.authority import AuthorityConfig
from shoal.elastic.chaos import ChaosEvent
from shoal.elastic.report import FaultEvent, build_report
from shoal.errors import ControlError
from shoal.elastic.launch_config import LaunchConfig
from shoal.elastic.liveness import LivenessConfig
from shoal.elastic.netaddr import interface_of, parse_endpoint, worker_address
from shoal.elastic.serve import RendezvousServer
from shoal.elastic.gate import StoreTunnel
from shoal.elastic.worker_pool import WorkerPool
from shoal.spec.elastic import ElasticReport, FaultKind
from shoal.train.rendezvous import Rendezvous, connect

__all__ = ["LaunchConfig", "Launcher", "worker_command"]

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0
SUPERVISE_EVERY_S = 0.02  # chaos timing and exit checks; the authority does not wait on it
DONE_EVERY_S = 0.2  # how often the launcher asks the store whether the job is done
FINISH_GRACE_S = 60.0  # once the job is done, how long workers get to exit on their own
LINGER_S = 15.0  # the serving host keeps the store up until other hosts' workers exit, at most this
# With the store gone, how long this host's workers get to exit on their own: one that saw
# the job done exits at once; one cut off mid-step does not, and the store's loss is an error.
STORE_LOST_GRACE_S = 5.0
EMPTY_JOB_S = 60.0  # the serving host gives up after this long with no worker on any host


class Launcher:
    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        config.run_dir.mkdir(parents=True, exist_ok=True)
        self.server: RendezvousServer | None = None
        self.tunnel: StoreTunnel | None = None
        self.faults: list[FaultEvent] = []
        self._pending = list(config.chaos)
        self._sigterm = threading.Event()
        self._empty_since: float | None = None
        self._store_closed_after_finish = False  # see _job_done
        self._exits_seen: set[str] = set()  # workers whose exit was looked at
        self._restarts_left = config.max_restarts
        try:
            self.rdzv, self.endpoint = self._open_rendezvous()
            self.node = self._claim_node() if config.rendezvous else ""
            env = {**self._gloo_env(), **config.env,
                   "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
        except BaseException:
            self._close_rendezvous()
            raise
        self.pool = WorkerPool(config, self.node, self.endpoint, env, on_exit=self._on_exit,
                               activate=lambda spare: self.rdzv.activate(spare))

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
        if config.rendezvous_pass is not None:
            # A market job's host, behind its gate: this launcher and its workers reach the
            # store through a tunnel here (the pass is this launcher's, not theirs to hold).
            self.tunnel = StoreTunnel(host, port, config.rendezvous_pass)
            self.tunnel.check()
            return Rendezvous(connect("127.0.0.1", self.tunnel.port)), self.tunnel.endpoint
        return Rendezvous(connect(host, port)), config.rendezvous

    def _claim_node(self) -> str:
        """This host's name in worker ids; a name already taken in this job (two hosts with
        one hostname, or a restarted host) gets a suffix, so ids never repeat."""
        node = self.config.node or socket.gethostname()
        claims = self.rdzv.claim_node(node)
        if claims == 1:
            return node
        log.warning("node name %r is already in this job; this host's workers are %s.%d-w<i>",
                    node, node, claims)
        return f"{node}.{claims}"

    def _gloo_env(self) -> dict[str, str]:
        """Across hosts, gloo must bind the interface that peers can reach (it guesses
        from the hostname otherwise, which in general they cannot)."""
        if self.config.rendezvous is None or "GLOO_SOCKET_IFNAME" in os.environ:
            return {}  # one host: loopback works; or the user chose the interface
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
        if self.tunnel is not None:
            self.tunnel.close()
        self.tunnel = None

    def _on_exit(self, worker: str) -> None:
        """Runs in the worker's exit watcher: every host's authority learns of it at once."""
        log.debug("%s exited with status %s", worker, self.pool.workers[worker].process.returncode)
        if self.server is not None and self.server.authority is not None:
            self.server.authority.notify()
        rdzv = self.rdzv
        if rdzv is not None:
            rdzv.report_exit(worker)

    # -- the run ---------------------------------------------------------

    def run(self) -> ElasticReport | None:
        """Supervise until the job is done; the serving launcher returns the run's report."""
        started = time.time()
        if self.server is not None:
            (self.config.run_dir / "launch.json").write_text(json.dumps({"t0": started}))
            self.server.start_authority(
                AuthorityConfig(min_workers=self.config.min_workers or self.config.workers,
                                liveness=LivenessConfig(floor_s=self.config.stall_deadline_s)),
                process_alive=self.pool.alive, event_log=self.config.run_dir / "epochs.jsonl")
        previous = self._catch_sigterm()
        try:
            self.pool.start()
            self._supervise(started)
            return self._report(started) if self.server is not None else None
        finally:
            self.pool.kill_all()
            self._close_rendezvous()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _catch_sigterm(self) -> object | None:
        if threading.current_thread() is not threading.main_thread():
            return None  # only the main thread may set handlers; the caller handles signals
        return signal.signal(signal.SIGTERM, lambda *_: self._sigterm.set())

    def _supervise(self, started: float) -> None:
        deadline = started + self.config.timeout_s
        next_note = started + PROGRESS_EVERY_S
        next_look = 0.0
        while True:
            now = time.time()
            # A store round trip, so not at every chaos tick; but always before workers that
            # have all exited are judged (they exit once they see the job done).
            if now >= next_look or not self.pool.alive_count():
                next_look = now + DONE_EVERY_S
                if self._job_done():
                    break
            if self._sigterm.is_set():
                self._leave_on_sigterm()
            if now >= next_note:
                next_note = now + PROGRESS_EVERY_S
                self._log_progress()
            if now > deadline:
                raise ControlError(f"run did not finish within {self.config.timeout_s:.0f} s; "
                                   f"worker logs are in {self.config.run_dir}")
            self._inject_due(now - started)
            self.pool.wake_stalled(now)
            self._replace_unasked_exits(now - started)
            self._check_workers_left(now)
            time.sleep(SUPERVISE_EVERY_S)
        # Read now: once this host's workers are gone, the serving host may close the store.
        failure = None if self._store_closed_after_finish else self.rdzv.failure()
        if self.server is not None:
            self.server.stop_authority()  # workers exiting at the end are not faults
        self.pool.wait_for_exit(FINISH_GRACE_S)
        if self.server is not None and self.config.rendezvous is not None:
            self._linger_for_other_hosts()
        if failure:
            raise ControlError(f"the run was given up: {failure}")

    def _job_done(self) -> bool:
        try:
            return self.rdzv.done()
        except RuntimeError as error:  # c10d's store errors are RuntimeErrors
            # The serving host may close the store as soon as the job is done (at once with
            # `--linger-s 0`), between our last look and this one, while our workers, done
            # too, are still exiting: they get a moment to, and tell by their exit status.
            self.pool.wait_for_exit(STORE_LOST_GRACE_S)
            if self._workers_finished():
                log.info("the serving host closed the store after this host's workers "
                         "finished the job")
                self._store_closed_after_finish = True
                return True
            raise ControlError(f"lost the rendezvous store at {self.endpoint} ({str(error)[:120]}); "
                               "the serving host is gone or unreachable, so this host's workers "
                               "are stopped") from None

    def _workers_finished(self) -> bool:
        """Every worker of this host (spares aside) has exited with status 0, and none was
        asked to leave: a worker exits so only once it has seen the job done."""
        workers = [p for w, p in self.pool.workers.items() if w not in self.pool.spares]
        asked_to_leave = self._sigterm.is_set() or any(
            f.kind is FaultKind.leave for f in self.faults)
        return (bool(workers) and not asked_to_leave
                and all(not p.alive() and p.process.returncode == 0 for p in workers))

    def _log_progress(self) -> None:
        authority = self.server.authority if self.server is not None else None
        if authority is not None:
            log.info("step %d, epoch %d, %d workers", self.rdzv.progress(), authority.epoch,
                     len(authority.members))
        else:
            log.info("step %d; %d workers here", self.rdzv.progress(), self.pool.alive_count())

    def _check_workers_left(self, now: float) -> None:
        if self.pool.alive_count() or any(e.kind is FaultKind.join for e in self._pending):
            self._empty_since = None
            return
        if self.config.rendezvous is None:
            raise ControlError("every worker exited before the job finished; see "
                               f"{self.config.run_dir}/w*.log"
                               + _first_error(self.config.run_dir, "w*.log"))
        if self.server is None:
            raise ControlError(f"every worker on {self.node} exited before the job finished; "
                               f"see {self.config.run_dir}/{self.node}-w*.log"
                               + _first_error(self.config.run_dir, f"{self.node}-w*.log"))
        # The serving host keeps the store up while other hosts' workers train.
        authority = self.server.authority
        if authority is not None and authority.members:
            self._empty_since = None
            return
        self._empty_since = self._empty_since or now
        if now - self._empty_since > EMPTY_JOB_S:
            raise ControlError(f"no worker on any host for {EMPTY_JOB_S:.0f} s; giving the job up")

    def _inject_due(self, elapsed_s: float) -> None:
        if not self._pending:
            return
        by_step = any(e.at_step is not None for e in self._pending)
        step = self.rdzv.progress() if by_step else 0
        for event in [e for e in self._pending if e.due(elapsed_s, step)]:
            self._pending.remove(event)
            fault = self.pool.inject(event, elapsed_s)
            if fault is not None:
                self.faults.append(fault)

    def _replace_unasked_exits(self, elapsed_s: float) -> None:
        """A worker that exited on its own (not done, not by --chaos) is a fault of the
        run's, in its report; on one host a new worker joins in its place while others
        still hold the job's state, up to --max-restarts (see LaunchConfig.max_restarts)."""
        injected = {f.worker for f in self.faults if f.kind is not FaultKind.join}
        for worker, process in list(self.pool.workers.items()):
            if worker in self._exits_seen or process.alive():
                continue
            self._exits_seen.add(worker)
            code = process.process.returncode
            if worker in injected or worker in self.pool.spares or code == 0:
                continue
            self.faults.append(FaultEvent(FaultKind.exit, worker, time.time()))
            log.warning("%s exited unasked (status %s)%s", worker, code,
                        _first_error(self.config.run_dir, f"{worker}.log", lines=3))
            if self.config.rendezvous is not None or not self.pool.alive_count():
                continue  # across hosts the agent restarts; with nobody left, no one to join
            if self._restarts_left <= 0:
                log.warning("no restart left for it (--max-restarts %d)",
                            self.config.max_restarts)
                continue
            self._restarts_left -= 1
            fault = self.pool.inject(ChaosEvent(FaultKind.join, None), elapsed_s)
            if fault is not None:
                self.faults.append(fault)
                log.info("%s joins in its place (%d restarts left)", fault.worker,
                         self._restarts_left)

    # -- ending ----------------------------------------------------------

    def _leave_on_sigterm(self) -> NoReturn:
        grace = self.config.grace_s
        log.warning("SIGTERM: asking this host's workers to leave (%.0f s grace)", grace)
        left, killed = self.pool.leave_gracefully(grace)
        raise ControlError(
            f"stopped by SIGTERM: {left} worker(s) handed over and left, {killed} killed after "
            f"the {grace:.0f} s grace period" + ("; resume from checkpoints with --resume"
                                                 if self.config.rendezvous is None else ""))

    def _linger_for_other_hosts(self) -> None:
        """Keep the store up until the other hosts' workers are gone (they may still read it)."""
        assert self.server is not None and self.server.authority is not None
        remote = [m for m in self.server.authority.members if m not in self.pool.workers]
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


def worker_command(script: str, args: list[str]) -> list[str]:
    return [sys.executable, script, *args]


def _first_error(run_dir: Path, pattern: str, lines: int = 25) -> str:
    """The traceback of the first worker whose log ends in one (as torchrun shows the
    failing rank's): a user's bug is read here, not hunted for in a log."""
    for path in sorted(run_dir.glob(pattern)):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        start = text.rfind("Traceback (most recent call last)")
        if start >= 0:
            tail = text[start:].rstrip().splitlines()[-lines:]
            return f"\n{path.name} failed with:\n" + "\n".join(tail)
    return ""
