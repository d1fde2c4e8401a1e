"""The coordinator and its commands as a user runs them: separate processes,
a real port, a key file; a SIGKILLed coordinator comes back from its store."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import httpx
import pytest

from tests.conftest import free_port, shoal_command
from tests.coordinator.conftest import TINY_JOB


def start_coordinator(store: str, port: int, env) -> subprocess.Popen:
    process = subprocess.Popen(shoal_command("coordinator", "--store", store, "--port", str(port)),
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
        assert process.poll() is None, process.stdout.read()
    raise AssertionError("coordinator did not answer /healthz within 30 s")


def shoal(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(shoal_command(*args), env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_submit_list_and_survive_a_sigkill(tmp_path, cli_env):
    port, store = free_port(), f"sqlite:///{tmp_path}/store.db"
    env = {**cli_env, "SHOAL_COORDINATOR_URL": f"http://127.0.0.1:{port}",
           "SHOAL_KEY": str(tmp_path / "alice.key")}
    job_file = tmp_path / "tiny.toml"
    job_file.write_text(TINY_JOB)
    coordinator = start_coordinator(store, port, env)
    try:
        made = shoal(env, "key", "new", str(tmp_path / "alice.key"))
        assert made.returncode == 0 and made.stdout.startswith("0x")
        again = shoal(env, "key", "new", str(tmp_path / "alice.key"))
        assert again.returncode == 2 and "never overwritten" in again.stderr
        submitted = shoal(env, "submit", str(job_file), "--workers", "2", "--max-price", "1000",
                          "--budget", "1000000")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        refused = shoal(env, "submit", str(job_file), "--workers", "0", "--max-price", "1",
                        "--budget", "1")
        assert refused.returncode == 2 and "workers" in refused.stderr
        assert "Traceback" not in refused.stderr

        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=10)
        coordinator = start_coordinator(store, port, env)
        (job,) = json.loads(shoal(env, "jobs", "--json").stdout)
        assert (job["job_id"], job["workers"], job["budget_wei"]) == (job_id, 2, 1000000)
        events = shoal(env, "events", job_id).stdout
        assert "job_submitted" in events
        assert shoal(env, "top-up", job_id, "5").returncode == 0
        assert json.loads(shoal(env, "jobs", "--json").stdout)[0]["budget_wei"] == 1000005
        assert shoal(env, "providers").returncode == 0
    finally:
        coordinator.send_signal(signal.SIGTERM)
        # SIGTERM stops it cleanly: uvicorn drains, then re-raises the signal as its status.
        assert coordinator.wait(timeout=15) in (0, -signal.SIGTERM)
        assert "Traceback" not in coordinator.stdout.read()


def test_an_unreachable_coordinator_is_one_line(cli_env):
    env = {**cli_env, "SHOAL_COORDINATOR_URL": f"http://127.0.0.1:{free_port()}"}
    result = shoal(env, "jobs")
    assert result.returncode == 2
    assert "cannot reach the coordinator" in result.stderr and "Traceback" not in result.stderr


def test_bound_beyond_loopback_without_tls_it_refuses_to_start_and_says_what_to_pass(cli_env):
    refused = shoal(cli_env, "coordinator", "--host", "0.0.0.0", "--port", str(free_port()),
                    "--operator", "0x" + "1" * 40)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    for option in ("--tls-cert", "--tls-self-signed", "--insecure-http",
                   "--coordinator-cert-sha256"):
        assert option in refused.stderr


@pytest.mark.slow
def test_a_self_signed_coordinator_is_reached_by_its_pin_and_keeps_its_certificate(
        tmp_path, cli_env):
    port = free_port()
    env = {**cli_env, "SHOAL_COORDINATOR_DATA_DIR": str(tmp_path / "coord"),
           "SHOAL_COORDINATOR_URL": f"https://127.0.0.1:{port}"}
    command = shoal_command("coordinator", "--store", f"sqlite:///{tmp_path}/store.db",
                            "--port", str(port), "--tls-self-signed")
    fingerprints = []
    for _ in range(2):  # made once, and the same after a restart: agents' pins stay valid
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        try:
            line = process.stdout.readline()
            while "certificate SHA-256" not in line:
                assert line, "the coordinator printed no certificate"
                line = process.stdout.readline()
            fingerprints.append(line.split()[2])
            deadline = time.monotonic() + 30
            while (listed := shoal({**env, "SHOAL_COORDINATOR_CERT_SHA256": fingerprints[-1]},
                                   "jobs", "--json")).returncode != 0:
                assert time.monotonic() < deadline, listed.stderr
                time.sleep(0.5)
            assert json.loads(listed.stdout) == []
            wrong = shoal(env, "jobs", "--coordinator-cert-sha256", "ab" * 32)
            assert wrong.returncode == 2 and "not the pinned" in wrong.stderr
            assert "Traceback" not in wrong.stderr
            unpinned = shoal(env, "jobs")
            assert "--coordinator-cert-sha256" in unpinned.stderr
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=15)
    assert fingerprints[0] == fingerprints[1]
