"""One worker process as its launcher holds it: started so that it cannot
outlive the launcher, signalled, watched for its exit, and killed whole.

Each worker runs in its own process group (a kill reaches the processes it
started too) and asks the kernel to SIGKILL it when its launcher dies
(PR_SET_PDEATHSIG), so even a SIGKILLed launcher leaves no orphans behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from shoal.elastic.preload import ForkedWorker, forkable

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with(parent_pid: int, niceness: int) -> Callable[[], None]:
    """Runs in the child between fork and exec (async-signal-safe calls only)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def setup() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
        if niceness:
            os.nice(niceness)

    return setup


class WorkerProcess:
    """A started worker; `on_exit(worker)` runs in a watcher thread when it exits."""

    def __init__(self, worker: str, command: list[str], env: dict[str, str], log_path: Path,
                 on_exit: Callable[[str], None], niceness: int = 0, preloaded: bool = False) -> None:
        """`preloaded`: fork a Python worker from the preloaded fork server (shoal.elastic.
        preload) rather than execute it, where it can be."""
        self.worker = worker
        self.process: subprocess.Popen | ForkedWorker
        if preloaded and forkable(command):
            self.process = ForkedWorker(command, env, log_path, niceness)
        else:
            self.process = self._execute(command, env, log_path, niceness)
        self._on_exit = on_exit
        self._watcher = threading.Thread(target=self._watch, name=f"exit-{worker}", daemon=True)
        self._watcher.start()

    @staticmethod
    def _execute(command: list[str], env: dict[str, str], log_path: Path,
                 niceness: int) -> subprocess.Popen:
        with open(log_path, "ab") as output:
            # PDEATHSIG is tied to the thread that forks; the launcher forks from the thread
            # that runs it and lives as long, so that thread's end is the launcher's end.
            return subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT,
                                    process_group=0, preexec_fn=_die_with(os.getpid(), niceness))

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def renice(self, niceness: int) -> None:
        """Set every thread's niceness (Linux keeps one per thread). Lowering it needs
        privilege (root or CAP_SYS_NICE); without it the worker keeps its niceness,
        which only slows it where the CPU is contended (its share then shrinks)."""
        try:
            for task in os.listdir(f"/proc/{self.pid}/task"):
                os.setpriority(os.PRIO_PROCESS, int(task), niceness)
        except PermissionError:
            log.warning("cannot renice %s to %d (needs root or CAP_SYS_NICE); it keeps its "
                        "lower priority", self.worker, niceness)
        except (FileNotFoundError, ProcessLookupError):
            pass  # it exited meanwhile

    def signal(self, signum: int) -> None:
        """Send `signum` to the worker itself (not its children)."""
        if self.alive():
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the worker and everything in its process group, and reap it."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self.signal(signal.SIGKILL)
        self.process.wait()

    def wait(self, timeout_s: float) -> bool:
        """True once the worker has exited; False if it still runs after `timeout_s`."""
        return exited_within(self.process, timeout_s)

    def join_watcher(self, timeout_s: float) -> None:
        self._watcher.join(timeout_s)

    def _watch(self) -> None:
        self.process.wait()
        try:
            self._on_exit(self.worker)
        except Exception as error:  # the store may be gone at the end of a run; nothing to tell then
            log.debug("could not report the exit of %s: %s", self.worker, error)


def exited_within(process: subprocess.Popen | ForkedWorker, timeout_s: float) -> bool:
    """True once `process` has exited; False if it still runs after `timeout_s`."""
    try:
        process.wait(timeout=max(0.0, timeout_s))
        return True
    except subprocess.TimeoutExpired:
        return False
