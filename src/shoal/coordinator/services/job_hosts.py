"""The coordinator's job hosts: one process per running job serving its
rendezvous and membership authority (shoal.elastic.job_host).

They run in sessions of their own, so a coordinator killed with SIGKILL
leaves them serving: workers keep training, and the coordinator, back from
its store, finds each job's host by the pid and endpoint it recorded.

Each host serves behind a gate (`shoal.elastic.gate`) whose keys the
coordinator makes in the job's run directory before the host starts: it hands
each lease its token from them, and reads the store itself on loopback.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from shoal.elastic.gate_keys import GateKeys, lease_identity
from shoal.elastic.job_host import read_final, read_host
from shoal.spec.coordinator import RendezvousPass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostState:
    """What a round learns of one job's host."""

    rendezvous: str | None = None  # HOST:PORT once it serves (its gate, for workers)
    pid: int | None = None
    final: dict[str, object] | None = None  # set once the job is done or given up
    lost: bool = False  # the process is gone and left no final word


class JobHosts:
    def __init__(self, jobs_dir: Path, bind: str, stall_deadline_s: float = 1.0) -> None:
        self.jobs_dir, self.bind, self.stall_deadline_s = jobs_dir, bind, stall_deadline_s
        self._children: dict[str, subprocess.Popen] = {}  # reaped here; adopted ones are not ours
        self._gates: dict[str, GateKeys] = {}  # job -> its gate's keys, once its host serves
        self._stores: dict[str, str] = {}  # job -> its store's loopback endpoint, once known
        self._revoked: dict[str, set[int]] = {}  # job -> the leases whose tokens it revoked

    def run_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    def gate_dir(self, job_id: str) -> Path:
        return self.run_dir(job_id) / "gate"

    def start(self, job_id: str, min_workers: int, steps: int | None = None) -> int:
        """Start the job's host; returns its pid (its endpoint shows in `state` once it serves).
        `steps`: the job's, so that the host ends it there and no sooner."""
        run_dir = self.run_dir(job_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        GateKeys.create_or_load(self.gate_dir(job_id))  # here: tokens are handed out from them
        command = [sys.executable, "-m", "shoal.cli.main", "rendezvous", "--bind", self.bind,
                   "--port", "0", "--run-dir", str(run_dir), "--min-workers", str(min_workers),
                   "--stall-deadline-s", str(self.stall_deadline_s),
                   "--gate-dir", str(self.gate_dir(job_id))]
        if steps is not None:
            command += ["--steps", str(steps)]
        with open(run_dir / "host.log", "ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"})
        self._children[job_id] = process
        log.info("job %s: host started (pid %d), run dir %s", job_id, process.pid, run_dir)
        return process.pid

    def state(self, job_id: str, pid: int | None) -> HostState:
        run_dir = self.run_dir(job_id)
        final = read_final(run_dir)
        host = read_host(run_dir)
        endpoint = str(host["endpoint"]) if host else None
        alive = pid is not None and self._alive(job_id, pid)
        return HostState(rendezvous=endpoint, pid=pid, final=final,
                         lost=pid is not None and not alive and final is None)

    def store_endpoint(self, job_id: str, public: str | None) -> str | None:
        """Where this machine reads the job's store: inside the gate, on loopback, as the
        host says; else the `public` endpoint (a host that serves without a gate)."""
        store = self._stores.get(job_id)
        if store is None:  # a host writes it once, when it starts serving: read it once
            host = read_host(self.run_dir(job_id))
            if not host or "store" not in host:
                return public
            store = self._stores[job_id] = str(host["store"])
        return store

    def gate_pass(self, job_id: str, lease: int) -> RendezvousPass | None:
        """What lease `lease`'s worker shows the job's gate; None for a host that serves
        without one (or does not serve yet)."""
        keys = self._gates.get(job_id)
        if keys is None:  # read once the host serves (agents beat often; files do not change)
            host = read_host(self.run_dir(job_id))
            if not host or "cert_sha256" not in host:
                return None
            keys = self._gates[job_id] = GateKeys.load(self.gate_dir(job_id))
        return keys.gate_pass(lease_identity(lease))

    def revoke(self, job_id: str, leases: set[int]) -> None:
        """Revoke the gate tokens of the job's `leases` (ended) if not done yet: their
        workers' connections close and no new one is let in."""
        if self._revoked.get(job_id) == leases or not self.gate_dir(job_id).exists():
            return
        keys = self._gates.get(job_id) or GateKeys.load(self.gate_dir(job_id))
        keys.revoke({lease_identity(n) for n in leases})
        self._revoked[job_id] = set(leases)

    def stop(self, job_id: str, pid: int | None) -> None:
        """End a cancelled job's host (its workers are told to stop by their agents)."""
        if pid is not None and self._alive(job_id, pid):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        child = self._children.pop(job_id, None)
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def stop_all(self) -> None:
        """Stop every host this object started (tests; a coordinator's exit leaves them on)."""
        for job_id, child in list(self._children.items()):
            self.stop(job_id, child.pid)

    def _alive(self, job_id: str, pid: int) -> bool:
        child = self._children.get(job_id)
        if child is not None and child.pid == pid:
            return child.poll() is None
        try:  # a host adopted after a restart: not our child, so only a signal 0 tells
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return False
