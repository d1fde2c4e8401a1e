"""A submitter's own script on the market (issue 41), end to end: `shoal submit
SCRIPT.py -r requirements.txt` bundles examples/market-transformers (a transformers
GPT-2 with its linear warm-up schedule) and sends it; agents fetch it, check it
against the job's hash, build its environment and run it in their sandboxes,
reading a tokenized corpus from a real S3 API (moto's server); one agent's machine
is lost mid-run and the market leases the third; the job ends at its steps with
the held-out loss of the same script under `shoal run` on one worker."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shoal.agent.sandbox import Disk, sandbox_problem
from shoal.spec.coordinator import JobStatus, Registration
from tests.conftest import free_port, shoal_command
from tests.coordinator.e2e import Stack, kill_group, submitter, wait_healthy
from tests.coordinator.test_agents import wait_for
from tests.harness.s3 import aws_env, s3_bucket

REPO = Path(__file__).resolve().parents[2]
PRICE = 1_000_000
STEPS = 150
EXAMPLE = REPO / "examples" / "market-transformers"
SCRIPT_ARGS = ("--data", "s3://corpus/tokens/train-*.bin", "--steps", str(STEPS),
               "--warmup", "15")


@pytest.mark.slow
def test_a_submitters_script_runs_sandboxed_on_the_market_through_a_lost_machine(
        tmp_path, cli_env):
    if (problem := sandbox_problem()) is not None:
        pytest.fail(f"bundled jobs need the sandbox: {problem} (.ci/run installs it)")
    with s3_bucket("corpus", _phrases()) as s3:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        # The agents' own environment has no credential for the bucket: the job brings
        # what its script reads the data with (`--env`), as a submitter's job would.
        stack = Stack(tmp_path, {**cli_env, "SHOAL_COORDINATOR_DATA_DIR": str(tmp_path / "coord")})
        try:
            coordinator = stack.coordinator(f"sqlite:///{tmp_path}/store.db", "127.0.0.1", port)
            wait_healthy(url, coordinator)
            # c asks the most: leased only once b is lost.
            agents = {name: stack.agent(name, url, PRICE + i, slowdown=2.0)
                      for i, name in enumerate("abc")}
            alice = submitter(url, tmp_path)
            wait_for(lambda: sum(len(p.offers) for p in alice.providers()), lambda n: n == 3,
                     120, stack, "three agents offering")
            alice.register(Registration(role="submitter", name="alice"))
            submitted = subprocess.run(
                shoal_command("submit", str(EXAMPLE / "train.py"), "--workers", "2",
                              "-r", str(EXAMPLE / "requirements.txt"),
                              "--max-price", str(2 * PRICE), "--budget", str(10**15),
                              "--steps", str(STEPS), "--global-batch", "16",
                              # The endpoint in the (public) job file; the credentials
                              # from the submitter's environment, as secrets.
                              "--env", f"AWS_ENDPOINT_URL={s3['endpoint_url']}",
                              *(f"--secret-env={k}" for k in aws_env(s3)
                                if k != "AWS_ENDPOINT_URL"),
                              "--coordinator", url, "--key", str(tmp_path / "alice.key"),
                              "--", *SCRIPT_ARGS),
                env={**cli_env, **aws_env(s3)}, capture_output=True, text=True, cwd=REPO,
                timeout=120)
            assert submitted.returncode == 0, submitted.stderr
            job_id = submitted.stdout.strip()
            assert "AWS_SECRET_ACCESS_KEY" not in alice.job_file(job_id)
            assert "bundle " in submitted.stderr and " sent" in submitted.stderr

            # Both leases' workers train; then agent b's machine is lost whole.
            wait_for(lambda: _steps_logged(tmp_path / "b"), lambda n: n >= 20, 300, stack,
                     "agent b's sandboxed worker training")
            # Each lease's job directory is a disk of its own.
            assert [os.path.ismount(p) for p in (tmp_path / "a").glob("lease-*/job")] == [True]
            kill_group(agents["b"])
            wait_for(lambda: _steps_logged(tmp_path / "c"), lambda n: n >= 1, 300, stack,
                     "agent c's worker joining in b's place")
            done = wait_for(lambda: alice.job(job_id), lambda j: j.status in (
                JobStatus.finished, JobStatus.failed), 600, stack, "job end")
            assert done.status is JobStatus.finished, stack.logs()
            # The leases over, their disks go (and the images with them).
            wait_for(lambda: [*tmp_path.glob("[ac]/lease-*/.job.disk")], lambda d: not d, 60,
                     stack, "the ended leases' disks released")
            final = json.loads((tmp_path / "coord" / "jobs" / job_id / "final.json").read_text())
            market = final["final"]
            for agent in "ac":
                log = "".join(p.read_text() for p in (tmp_path / agent).glob("lease-*/worker.log"))
                assert "Traceback" not in log, log[-3000:]
                # The bundle's own environment, built once: its pin, the provider's torch.
                (environment,) = (p for p in (tmp_path / agent / "environments").iterdir()
                                  if p.is_dir())
                assert "transformers==5.25.0" in (environment / "shoal-env.json").read_text()
        finally:
            stack.close()
            for image in tmp_path.glob("*/lease-*/.job.disk"):  # b's: its machine was lost
                Disk.release_image(image)

        # The same script under `shoal run`, on one worker: the same samples in the same order.
        report = tmp_path / "one.json"
        alone = subprocess.run(
            shoal_command("run", str(EXAMPLE / "train.py"), "--workers", "1",
                          "--run-dir", str(tmp_path / "alone"), "--report", str(report),
                          "--", *SCRIPT_ARGS),
            env={**cli_env, **aws_env(s3)}, capture_output=True, text=True, cwd=REPO,
            timeout=600)
        assert alone.returncode == 0, alone.stderr[-2000:]
    alone = json.loads(report.read_text())
    # The schedule followed through the loss and the join; the same held-out loss (the
    # issue asks 0.02; the runtime's exact data order gives far closer).
    assert market["lr"] == alone["published"]["lr"] == 0.0
    assert market["val_loss"] == pytest.approx(alone["val_loss"], abs=1e-3)
    assert market["val_loss"] < 9.0  # it learned (ln 50257 = 10.8 at the start)


def _steps_logged(agent_dir: Path) -> int:
    """Steps a lease's sandboxed launcher logged on this agent (rank 0 or not)."""
    return sum(len(p.read_text().splitlines())
               for p in agent_dir.glob("lease-*/job/run-*/steps-*.jsonl"))


def _phrases() -> dict[str, bytes]:
    """Three shards of token ids made of 40 repeated phrases: a corpus to learn from."""
    rng = np.random.default_rng(0)
    phrases = [rng.integers(0, 50257, size=12, dtype=np.uint16) for _ in range(40)]
    return {f"tokens/train-{i:03d}.bin":
            np.concatenate([phrases[j] for j in rng.integers(0, 40, size=400)]).tobytes()
            for i in range(3)}
