"""A stranger on the path between leased hosts (issue 40, point 12): gloo's tensor
traffic is neither encrypted nor authenticated, so one who sits on a host's link can
rewrite the gradients that cross it (here the harness's link emulator flips a bit of
some bulk TCP segments and fixes their checksums, so the kernel takes them). With work
records, each member checks that what its peers declared they sent, sent to it
directly, adds up to the sum it received, and refuses the step otherwise: the stranger
gets steps skipped (or, where its bit lands in gloo's framing, an exchange that hangs
until the collective times out, and is redone), and the job finishes with every
replica the same at every step. One run in several takes ~30 s longer for that."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_job_toml
from tests.harness.hosts_job import PORT, REPO

pytestmark = pytest.mark.slow

STEPS = 300
REFUSED = "do not add up to the exchanged"  # the sent check: sketches, or step scalars


def test_a_strangers_rewritten_gradients_are_refused_not_applied(network, tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text(tiny_job_toml(tmp_path / "ckpt", interval_steps=20, steps=STEPS,
                                      global_batch=12, eval_interval=1000)
                        + "[proof]\nenabled = true\nepoch_steps = 5\n")
    run = tmp_path / "run"
    run.mkdir()
    hosts = [network.add_host(f"h{i}") for i in range(3)]
    stranger = hosts[1]
    stranger.emulate()  # its link through the emulator from the start (a swap cuts connections)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launchers = []
    for host in hosts:
        command = [sys.executable, "-m", "shoal.cli.main", "-v", "train", str(job_file),
                   "--proof-dir", str(tmp_path / "proof"),
                   "--workers", "1", "--rendezvous", f"{hosts[0].address}:{PORT}",
                   "--node", host.name, "--run-dir", str(run), "--replica-check-every", "1"]
        if host is hosts[0]:
            command += ["--serve", "--min-workers", "3", "--report", str(run / "report.json")]
        launchers.append(host.popen(command, env=env, cwd=REPO,
                                    log=run / f"launcher-{host.name}.out"))
    _wait_for_step(run, 20, launchers)
    # The store's traffic is never rewritten (keep_port): the question is gloo's (the
    # gate's TLS guards the store's). One bulk segment in 2,000 (a step moves ~400 over
    # this link): about one step in six rewritten, so never the ten refusals in a row
    # that give a run up (a stranger who wants the job stopped can do that).
    stranger.emulate(rewrite_pct=0.05, keep_port=PORT)
    deadline = time.monotonic() + 30
    while _rewritten(stranger) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    stranger.emulate()  # the stranger leaves: the job must still finish
    codes = [launcher.wait(timeout=180) for launcher in launchers]
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(run.glob("*.log")))
    assert codes == [0, 0, 0], logs[-4000:]
    assert _rewritten(stranger) >= 8
    assert REFUSED in logs  # what the stranger rewrote was caught, and the step skipped
    report = json.loads((run / "report.json").read_text())
    assert report["steps"] == STEPS and report["guard_skipped_steps"] >= 1
    assert report["replica_checks"] >= STEPS and report["replica_mismatches"] == 0


def _rewritten(host) -> int:
    counters = host.link_counters()
    return counters["up"]["rewritten"] + counters["down"]["rewritten"]


def _wait_for_step(run: Path, step: int, launchers, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(launcher.poll() is not None for launcher in launchers):
            raise AssertionError("a launcher exited before the job got going")
        logs = list(run.glob("steps-*.jsonl"))
        if logs and sum(1 for _ in logs[0].open()) >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach step {step}")
