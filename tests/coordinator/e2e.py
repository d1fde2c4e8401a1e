"""Helpers of the end-to-end tests: a coordinator and agents as separate
processes, the way `shoal coordinator` and `shoal agent` run them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
from eth_account import Account

from shoal.client.http import CoordinatorClient
from shoal.client.tls import CertificatePin, client_context
from tests.conftest import shoal_command, tiny_job_toml

# Fast beats and short timeouts, so a lost agent is replaced in seconds.
COORDINATOR_ENV = {"SHOAL_COORDINATOR_HEARTBEAT_S": "0.5", "SHOAL_COORDINATOR_AGENT_TIMEOUT_S": "6",
                   "SHOAL_COORDINATOR_CLEAR_INTERVAL_S": "0.5"}


def job_toml(checkpoint_dir: Path, steps: int) -> str:
    return tiny_job_toml(checkpoint_dir, interval_steps=20, name="e2e", steps=steps)


def key_file(path: Path, account=None) -> Path:
    account = account or Account.create()
    path.write_text("0x" + bytes(account.key).hex() + "\n")
    return path


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 60.0,
                 pin: CertificatePin | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"coordinator exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/healthz", timeout=1,
                         verify=client_context(pin)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no coordinator at {url} after {timeout_s} s")


def stop(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a process and everything in its group: a machine lost at once."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class Stack:
    """A coordinator and its agents, each a `shoal` process with its own log."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, {**env, **COORDINATOR_ENV}
        self.processes: list[subprocess.Popen] = []
        # The certificate of a coordinator bound beyond loopback (it serves TLS there, with
        # a self-signed certificate that agents and submitters pin); None on loopback.
        self.cert_pin: CertificatePin | None = None

    def start(self, name: str, *args: str, host=None) -> subprocess.Popen:
        """Run `shoal ARGS` here, or inside `host` (a namespaced host of tests.harness)."""
        log = self.tmp / f"{name}.log"
        command = shoal_command(*args)
        if host is not None:
            process = host.popen(command, log=log, env=self.env)
        else:
            with open(log, "ab") as out:
                process = subprocess.Popen(command, env=self.env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def coordinator(self, store: str, bind: str, port: int, host=None,
                    operator: str | None = None, chain: tuple[str, ...] = (),
                    extra: tuple[str, ...] = ()) -> subprocess.Popen:
        """`chain`: the --chain-rpc, --contract and --operator-key to settle with."""
        args = ["coordinator", "--store", store, "--host", bind, "--port", str(port), *extra]
        if bind not in ("127.0.0.1", "localhost", "::1"):
            args.append("--tls-self-signed")
            self.cert_pin = CertificatePin(self_signed_certificate(
                Path(self.env["SHOAL_COORDINATOR_DATA_DIR"])))
        if operator:
            args += ["--operator", operator]
        if chain:
            args += ["--chain-rpc", chain[0], "--contract", chain[1], "--operator-key", chain[2]]
            # The agents started after it pin the same chain and contract (they sign lease
            # terms for no other), as a provider configures its own agent.
            answer = httpx.post(chain[0], json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId",
                                                "params": []}, timeout=10).json()
            self.pin = ("--chain-id", str(int(answer["result"], 16)), "--contract", chain[1])
        return self.start("coordinator", *args, host=host)

    def agent(self, agent_id: str, url: str, price: int, host=None, slowdown: float = 1.0,
              account=None, extra: tuple[str, ...] = ()) -> subprocess.Popen:
        key = key_file(self.tmp / f"{agent_id}.key", account)
        return self.start(agent_id, "agent", "--agent-id", agent_id, "--coordinator", url,
                          "--key", str(key), "--price", str(price), "--slowdown", str(slowdown),
                          "--work-dir", str(self.tmp / agent_id), "--grace-s", "5",
                          *getattr(self, "pin", ()), *self.cert_pin_args(), *extra, host=host)

    def url(self, address: str, port: int) -> str:
        """Where the coordinator `coordinator()` started on `address` answers."""
        return f"{'https' if self.cert_pin else 'http'}://{address}:{port}"

    def cert_pin_args(self) -> tuple[str, ...]:
        return ("--coordinator-cert-sha256", self.cert_pin.sha256) if self.cert_pin else ()

    def close(self) -> None:
        # Job hosts run in sessions of their own (they outlive a coordinator); end ours too.
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if str(self.tmp).encode() in cmdline.read_bytes() and b"rendezvous" in cmdline.read_bytes():
                    os.kill(int(cmdline.parent.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        for process in reversed(self.processes):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    process.kill()
                process.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log")))


def submitter(url: str, tmp: Path, account=None,
              pin: CertificatePin | None = None) -> CoordinatorClient:
    return CoordinatorClient(url, Account.from_key(key_file(tmp / "alice.key", account)
                                                   .read_text().strip()), pin=pin)


def self_signed_certificate(data_dir: Path) -> str:
    """The SHA-256 of the certificate a coordinator with this data directory serves with
    `--tls-self-signed`: made here first, as the coordinator would, and kept for it."""
    from shoal.coordinator.settings import CoordinatorSettings
    from shoal.coordinator.tls import served_certificate

    settings = CoordinatorSettings(data_dir=data_dir, tls_self_signed=True)
    return served_certificate(settings).sha256
