"""A submitter's own script on the market (issue 41), end to end: `shoal submit
SCRIPT.py` bundles examples/token_lm.py and sends it; two agents fetch it, check
it against the job's hash and run it in their sandboxes, reading a tokenized corpus
from a real S3 API (moto's server); one agent's machine is lost mid-run; the job
ends at its steps with the held-out loss of the same script under `shoal run` on
one worker."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from shoal.agent.sandbox import sandbox_problem
from shoal.spec.coordinator import JobStatus, Registration
from tests.conftest import free_port, shoal_command
from tests.coordinator.e2e import Stack, kill_group, submitter, wait_healthy
from tests.coordinator.test_agents import wait_for
from tests.harness.s3 import aws_env, s3_bucket
from tests.train.test_token_shards import shard_objects

REPO = Path(__file__).resolve().parents[2]
PRICE = 1_000_000
STEPS = 300
SCRIPT_ARGS = ("--data", "s3://corpus/tokens/train-*.bin", "--context", "8",
               "--steps", str(STEPS), "--global-batch", "16", "--vocab", "50304")


@pytest.mark.slow
def test_a_submitters_script_runs_sandboxed_on_the_market_through_a_lost_machine(
        tmp_path, cli_env):
    if (problem := sandbox_problem()) is not None:
        pytest.fail(f"bundled jobs need the sandbox: {problem} (.ci/run installs it)")
    with s3_bucket("corpus", shard_objects()) as s3:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        # The agents' own environment has no credential for the bucket: the job brings
        # what its script reads the data with (`--env`), as a submitter's job would.
        stack = Stack(tmp_path, {**cli_env, "SHOAL_COORDINATOR_DATA_DIR": str(tmp_path / "coord")})
        try:
            coordinator = stack.coordinator(f"sqlite:///{tmp_path}/store.db", "127.0.0.1", port)
            wait_healthy(url, coordinator)
            agents = {name: stack.agent(name, url, PRICE + i, slowdown=2.0)
                      for i, name in enumerate("ab")}
            alice = submitter(url, tmp_path)
            wait_for(lambda: sum(len(p.offers) for p in alice.providers()), lambda n: n == 2,
                     120, stack, "two agents offering")
            alice.register(Registration(role="submitter", name="alice"))
            submitted = subprocess.run(
                shoal_command("submit", "examples/token_lm.py", "--workers", "2",
                              "--max-price", str(2 * PRICE), "--budget", str(10**15),
                              "--steps", str(STEPS), "--global-batch", "16",
                              *(f"--env={k}={v}" for k, v in aws_env(s3).items()),
                              "--coordinator", url, "--key", str(tmp_path / "alice.key"),
                              "--", *SCRIPT_ARGS),
                env=cli_env, capture_output=True, text=True, cwd=REPO, timeout=120)
            assert submitted.returncode == 0, submitted.stderr
            job_id = submitted.stdout.strip()
            assert "bundle " in submitted.stderr and " sent" in submitted.stderr

            # Both leases' workers train; then agent b's machine is lost whole.
            wait_for(lambda: _steps_logged(tmp_path / "b"), lambda n: n >= 20, 300, stack,
                     "agent b's sandboxed worker training")
            kill_group(agents["b"])
            done = wait_for(lambda: alice.job(job_id), lambda j: j.status in (
                JobStatus.finished, JobStatus.failed), 600, stack, "job end")
            assert done.status is JobStatus.finished, stack.logs()
            final = json.loads((tmp_path / "coord" / "jobs" / job_id / "final.json").read_text())
            market_loss = final["final"]["val_loss"]
            worker_log = "".join(p.read_text() for p in (tmp_path / "a").glob("lease-*/worker.log"))
            assert "Traceback" not in worker_log, worker_log[-3000:]
        finally:
            stack.close()

        # The same script under `shoal run`, on one worker: the same samples in the same order.
        report = tmp_path / "one.json"
        alone = subprocess.run(
            shoal_command("run", "examples/token_lm.py", "--workers", "1",
                          "--run-dir", str(tmp_path / "alone"), "--report", str(report),
                          "--", *SCRIPT_ARGS),
            env={**cli_env, **aws_env(s3)}, capture_output=True, text=True, cwd=REPO,
            timeout=600)
        assert alone.returncode == 0, alone.stderr[-2000:]
    assert market_loss == pytest.approx(json.loads(report.read_text())["val_loss"], abs=1e-3)


def _steps_logged(agent_dir: Path) -> int:
    """Steps a lease's sandboxed launcher logged on this agent (rank 0 or not)."""
    return sum(len(p.read_text().splitlines())
               for p in agent_dir.glob("lease-*/job/run-*/steps-*.jsonl"))
