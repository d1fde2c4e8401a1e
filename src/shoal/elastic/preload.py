"""Worker processes forked from an interpreter that has already imported torch.

A Python worker's start on a CPU is mostly imports: torch (~2 s of CPU here),
torch._dynamo (~2 s more, which the first `optimizer.step()` pulls in) and
shoal. Four workers starting on two cores spend ~10 s on that before the job's
first step, and a replacement or a spare pays it again. A fork server that
imported them once (multiprocessing's `forkserver`, with its modules
preloaded) hands each worker a ready interpreter in a fork: the same program,
the same environment, the same `__main__`, started in tens of milliseconds.

Only a worker run by this interpreter (`[sys.executable, script | -m module,
args...]`) is forked; anything else is executed as before. The fork server
never runs a CUDA call or starts a thread before it forks, so the fork is safe;
each worker then applies its own environment (thread count included, which
torch read at import). SHOAL_WORKER_START=exec starts every worker by exec.

As with any multiprocessing start but `fork`, each worker imports the
launching program's main module first (as `__mp_main__`): a program that
starts workers this way keeps its work under `if __name__ == "__main__":`
(shoal's CLI does).
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from multiprocessing import forkserver
from pathlib import Path

__all__ = ["ForkedWorker", "forkable", "warm"]

# What every worker imports before its first step; a `-m shoal...` worker's own module too.
PRELOAD = ("numpy", "torch", "torch.distributed", "torch._dynamo", "shoal.train.run")
_PR_SET_PDEATHSIG = 1
_context = None


def forkable(command: list[str]) -> bool:
    """True if `command` runs a script or module with this interpreter, and forking is on."""
    if os.environ.get("SHOAL_WORKER_START", "fork") == "exec":
        return False
    if len(command) < 2 or command[0] != sys.executable:
        return False
    return len(command) >= 3 if command[1] == "-m" else not command[1].startswith("-")


def warm(command: list[str]) -> None:
    """Start the fork server now, so that it imports torch while the launcher still sets
    up (its own imports, the store): by the first worker's start it is ready."""
    if forkable(command):
        _fork_server(command)
        forkserver.ensure_running()


def _fork_server(command: list[str]):
    global _context
    if _context is None:
        module = command[2] if command[1] == "-m" else None
        _context = multiprocessing.get_context("forkserver")
        preload = ["shoal.elastic.preload_server", *PRELOAD,
                   *([module] if module and module.startswith("shoal.") else [])]
        _context.set_forkserver_preload(preload)
    return _context


class ForkedWorker:
    """A worker forked from the preloaded server, with the face of a `subprocess.Popen`
    (pid, poll, wait, send_signal, returncode) so that its holder cannot tell."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path,
                 niceness: int) -> None:
        context = _fork_server(command)
        self._process = context.Process(
            target=_worker_main, name=Path(log_path).stem,
            args=(command[1:], dict(env), str(log_path), niceness, os.getpid(), os.getcwd()))
        self._process.start()
        # One thread reaps it, and only that one: multiprocessing reads a forked child's exit
        # status off a pipe, so two readers at once could see a wrong one; and the
        # module's own bookkeeping (which polls every child at each start, from another
        # thread) must not read it either. The launcher kills its workers itself at the end.
        multiprocessing.process._children.discard(self._process)  # type: ignore[attr-defined]
        self.pid: int = self._process.pid  # type: ignore[assignment]
        self.returncode: int | None = None
        self._exited = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name=f"reap-{self.pid}", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        self._process.join()
        self.returncode = self._process.exitcode
        self._process.close()
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(["forked worker", str(self.pid)], timeout or 0.0)
        self._reaper.join()  # it is done: no thread of this worker outlives its wait
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if not self._exited.is_set():  # never signal a pid that may have been reused
            os.kill(self.pid, signum)


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (the fork server's: the launcher; a
    worker's: the fork server), and exit now if the parent already has."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent was gone before prctl took effect
        os._exit(1)


def _worker_main(argv: list[str], env: dict[str, str], log_path: str, niceness: int,
                 launcher_pid: int, cwd: str) -> None:
    """In the forked worker: become the process `python ARGV` would have been, then run it."""
    die_with_parent()  # the fork server, which dies with the launcher
    try:
        os.kill(launcher_pid, 0)  # the launcher may have died before the request was served
    except ProcessLookupError:
        os._exit(1)
    os.setpgid(0, 0)  # its own process group, as the exec path gives it: a kill reaches all
    if niceness:
        os.nice(niceness)
    output = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # torch read OMP_NUM_THREADS once, in the fork server: apply this worker's.
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    if argv[0] == "-m":
        # Preloaded for its imports; run afresh as __main__, as `python -m` would.
        sys.modules.pop(argv[1], None)
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = cwd
        target = lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        target = lambda: runpy.run_path(argv[0], run_name="__main__")  # noqa: E731
    try:
        target()
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()  # as the interpreter prints it, without multiprocessing's header
        raise SystemExit(1) from None
    finally:
        # As an interpreter's normal exit would (multiprocessing ends a child with
        # os._exit, which skips them): logging's flush, the program's own handlers.
        atexit._run_exitfuncs()
