"""What the reference harnesses share: step logs (one JSON
line per committed step and worker), their arithmetic, free ports and a run
directory whose processes are all killed on the way out.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.figures import Commit



class ReferenceRunError(RuntimeError):
    """A reference system did not start, hung, or died where it should have recovered."""


@dataclass(frozen=True)
class StepLine:
    """One committed step as one worker saw it."""

    step: int  # 0-based index of the step that committed
    t_start: float  # time.time() when the worker started computing it
    t_commit: float  # time.time() when the optimizer applied it
    world: int  # workers whose gradients the step averaged
    worker: str
    attempt: int  # torchrun restart count (0 for torchft: its steps never run twice)
    rank: int = -1  # the worker's rank in the step's group


class StepLogWriter:
    """Appends StepLines to a worker's own file, flushed per line so a SIGKILL loses none."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(path, "a", buffering=1, encoding="utf-8")

    def write(self, line: StepLine) -> None:
        self._handle.write(json.dumps(asdict(line)) + "\n")

    def close(self) -> None:
        self._handle.close()


def read_step_logs(directory: Path) -> list[StepLine]:
    """Every complete line of every *.jsonl in `directory` (a killed writer may leave half a line)."""
    lines = []
    for path in sorted(directory.glob("*.jsonl")):
        for text in path.read_text(encoding="utf-8").splitlines():
            try:
                lines.append(StepLine(**json.loads(text)))
            except (json.JSONDecodeError, TypeError):
                continue
    return lines


def latest_holder(lines: Iterable[StepLine], rank: int) -> str | None:
    """The worker that most recently committed a step at `rank`."""
    found = max((line for line in lines if line.rank == rank), key=lambda l: l.t_commit, default=None)
    return None if found is None else found.worker


def free_port() -> int:
    """A TCP port free right now on loopback (the OS picks it; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_threads(workers: int) -> int:
    """Intra-op threads per worker: the cores split evenly, at least one.

    More threads than cores makes torch's spinning thread pools fight: on these
    two cores a step went from 0.1 s to 1.5 s. Shoal's workers must use the same.
    """
    return max(1, (os.cpu_count() or 1) // workers)


def worker_env(**extra: str) -> dict[str, str]:
    """The environment for worker processes: this repository importable, one thread per pool."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra})
    return env


class RunDirectory:
    """A temporary directory for one reference run and every process it starts.

    Children run in their own sessions; `close()` SIGKILLs each session and any
    pid a worker registered under pids/ (torchrun puts its workers in new
    sessions), then removes the directory (kept if SHOAL_REF_KEEP=1, to debug).
    """

    def __init__(self, prefix: str) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=f"shoal-{prefix}-"))
        self.logs = self.path / "steps"
        self.pids = self.path / "pids"
        self.logs.mkdir()
        self.pids.mkdir()
        self._processes: list[subprocess.Popen] = []

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, args: list[str], log_name: str, env: dict[str, str]) -> subprocess.Popen:
        output = open(self.path / log_name, "ab")
        process = subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT, env=env,
                                   cwd=Path(__file__).resolve().parents[2],
                                   start_new_session=True)
        output.close()
        self._processes.append(process)
        return process

    def tail(self, log_name: str, chars: int = 3000) -> str:
        path = self.path / log_name
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"

    def registered_pids(self) -> dict[str, int]:
        """name -> pid, as workers wrote them under pids/."""
        found = {}
        for path in self.pids.iterdir():
            try:
                found[path.name] = int(path.read_text())
            except ValueError:
                continue  # being written
        return found

    def close(self) -> None:
        for process in self._processes:
            _kill_session(process.pid)
        for pid in self.registered_pids().values():
            if _is_ours(pid, self.path):
                _kill_session(pid)
        for process in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if os.environ.get("SHOAL_REF_KEEP") != "1":
            shutil.rmtree(self.path, ignore_errors=True)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _is_ours(pid: int, run_path: Path) -> bool:
    """Whether `pid` still runs a command naming our run directory (pids get reused)."""
    try:
        return str(run_path) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise ReferenceRunError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so that `finally` blocks kill our children."""
    signal.signal(signal.SIGTERM, _raise_exit)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def commits_of(lines: Iterable[StepLine]) -> list[Commit]:
    return [Commit(s.step, s.t_start, s.t_commit, s.world, s.attempt) for s in lines]
