"""The demo's separate processes: provider agents and the verifier, each a
`shoal` command of its own with its own log, the way they run on their own
machines; and the coordinator, served in this process on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import uvicorn
from eth_account.signers.local import LocalAccount

from shoal.coordinator import Coordinator, create_app
from shoal.errors import ControlError
from shoal.spec.demo import ScenarioProvider
from shoal.spec.market import Tenancy


LEAVE_GRACE_S = 60.0


def write_key(path: Path, account: LocalAccount) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("0x" + bytes(account.key).hex() + "\n")
    path.chmod(0o600)
    return path


class ServedCoordinator:
    """The coordinator's API on uvicorn, in a thread of this process."""

    def __init__(self, coordinator: Coordinator, host: str = "127.0.0.1") -> None:
        sock = socket.socket()
        sock.bind((host, coordinator.settings.port))
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        self.app = create_app(coordinator)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning",
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name="shoal-demo-api", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise ControlError(f"the coordinator did not start on {self.url}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class Processes:
    """`shoal` subprocesses, each in its own session (killed as a group, like a machine)."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir, self.env = run_dir, env
        self.running: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = self.run_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "shoal.cli.main", *args],
                                       env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        self.running[name] = process
        return process

    def agent(self, provider: ScenarioProvider, url: str, key: Path,
              chain: tuple[int, str]) -> subprocess.Popen:
        """`chain`: the chain id and contract the provider staked on (its agent signs lease
        terms only for them)."""
        args = ["agent", "--agent-id", provider.name, "--coordinator", url, "--key", str(key),
                "--chain-id", str(chain[0]), "--contract", chain[1],
                "--price", str(provider.price_wei_per_s), "--slowdown", str(provider.slowdown),
                "--work-dir", str(self.run_dir / "agents" / provider.name),
                # A leaving worker that is the last to hold the job's state waits for its
                # replacement to take it (a spot notice gives 30 s to 2 min).
                "--grace-s", str(LEAVE_GRACE_S)]
        if provider.tenancy is Tenancy.on_demand:
            args.append("--on-demand")
        if provider.adversary:
            args += ["--adversary", provider.adversary]
        return self.start(provider.name, *args)

    def notice(self, name: str) -> None:
        """A spot reclaim: the agent is told to stop; its workers leave gracefully."""
        self.running[name].send_signal(signal.SIGTERM)

    def kill(self, name: str) -> None:
        """The machine is gone: the agent and everything it started, at once."""
        process = self.running[name]
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def stop_all(self, grace_s: float = 15.0) -> None:
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in self.running.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
