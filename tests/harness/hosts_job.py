"""A shoal job across namespaced hosts: one `shoal run` launcher per host,
the first one serving the rendezvous, all writing to one run directory
(as hosts sharing a disk would), watched from the root namespace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.netns import Host, Network

REPO = Path(__file__).resolve().parents[2]
PORT = 29400  # every host has its own port space


@dataclass
class HostsJob:
    hosts: list[Host]
    workers: list[int]
    run_dir: Path
    launchers: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def serving(self) -> Host:
        return self.hosts[0]

    @property
    def endpoint(self) -> str:
        return f"{self.serving.address}:{PORT}"

    def start(self, script: list[str], *, extra: list[str] = (), env: dict[str, str] | None = None) -> None:
        """Start every host's launcher; `script` is SCRIPT [-- ARGS...]."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        for host, count in zip(self.hosts, self.workers):
            command = [sys.executable, "-m", "shoal.cli.main", "-v", "run", "--workers", str(count),
                       "--rendezvous", self.endpoint, "--node", host.name,
                       "--run-dir", str(self.run_dir), *extra]
            if host is self.serving:
                command += ["--serve", "--min-workers", str(sum(self.workers)),
                            "--report", str(self.run_dir / "report.json")]
            self.launchers[host.name] = host.popen(command + script, env=env, cwd=REPO,
                                                   log=self.run_dir / f"launcher-{host.name}.out")

    def progress(self) -> int:
        """The job's committed step, read from the store like any client would."""
        from shoal.train.rendezvous import Rendezvous, connect

        if not hasattr(self, "_rdzv"):
            self._rdzv = Rendezvous(connect(self.serving.address, PORT, timeout_s=30.0))
        return self._rdzv.progress()

    def wait_for_step(self, step: int, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_serving_alive()
            now = self.progress()
            if now >= step:
                return now
            time.sleep(0.05)
        raise AssertionError(f"the job did not reach step {step} in {timeout_s:.0f} s\n{self.outputs()}")

    def check_serving_alive(self) -> None:
        launcher = self.launchers[self.serving.name]
        if launcher.poll() is not None:
            raise AssertionError(f"the serving launcher exited ({launcher.returncode})\n{self.outputs()}")

    def worker_pids(self, host: Host) -> list[int]:
        """The processes of `host` other than its launcher."""
        launcher = self.launchers[host.name].pid
        return [pid for pid in host.pids() if pid != launcher]

    def kill_workers(self, host: Host) -> None:
        for pid in self.worker_pids(host):
            os.kill(pid, signal.SIGKILL)

    def wait(self, timeout_s: float = 90.0) -> dict[str, int]:
        """Exit status of every launcher (None: still running after the timeout, then killed)."""
        deadline = time.monotonic() + timeout_s
        codes = {}
        for name, launcher in self.launchers.items():
            try:
                codes[name] = launcher.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
                launcher.kill()
        return codes

    def report(self) -> dict:
        path = self.run_dir / "report.json"
        assert path.exists(), f"no report was written\n{self.outputs()}"
        return json.loads(path.read_text())

    def outputs(self, tail: int = 15) -> str:
        parts = []
        for path in sorted(self.run_dir.glob("*.out")) + sorted(self.run_dir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def close(self) -> None:
        if hasattr(self, "_rdzv"):
            del self._rdzv


def hosts_job(network: Network, workers: list[int], run_dir: Path) -> HostsJob:
    """Hosts h0, h1, ... with `workers[i]` workers each; h0 serves."""
    run_dir.mkdir(parents=True, exist_ok=True)
    hosts = [network.add_host(f"h{i}") for i in range(len(workers))]
    return HostsJob(hosts, workers, run_dir)
