"""Jobs across hosts made real with network namespaces: each host its own
address and launcher, the first one serving the rendezvous. Whatever
happens to a host (killed whole, cut off and healed, its workers killed
under a live authority), the job finishes with every sample seen once and
every replica the same."""

from __future__ import annotations

import time

import pytest

from tests.harness.hosts_job import hosts_job

pytestmark = pytest.mark.slow

STEPS = 600
BATCH = 64


def mlp(steps: int = STEPS) -> list[str]:
    return ["examples/elastic_mlp.py", "--", "--steps", str(steps), "--global-batch", str(BATCH)]


def assert_exact(job, codes: dict, steps: int = STEPS, serving_ok: bool = True) -> dict:
    assert codes[job.serving.name] == 0 or not serving_ok, f"{codes}\n{job.outputs()}"
    report = job.report()
    assert report["steps"] == steps, job.outputs()
    assert report["samples_seen"] == steps * BATCH
    assert report["samples_skipped"] == 0 and report["samples_duplicated"] == 0
    assert report["replica_checks"] > 0 and report["replica_mismatches"] == 0
    return report


def test_three_hosts_finish_exactly(network, tmp_path):
    job = hosts_job(network, [2, 1, 1], tmp_path / "run")
    job.start(mlp(), extra=["--replica-check-every", "5"])
    codes = job.wait()
    assert codes == {"h0": 0, "h1": 0, "h2": 0}, job.outputs()
    assert_exact(job, codes)
    first = (tmp_path / "run" / "epochs.jsonl").read_text().splitlines()[0]
    assert all(w in first for w in ("h0-w0", "h0-w1", "h1-w0", "h2-w0"))


def test_a_whole_host_killed_mid_run(network, tmp_path):
    job = hosts_job(network, [1, 1, 1], tmp_path / "run")
    job.start(mlp(), extra=["--replica-check-every", "5"])
    job.wait_for_step(100)
    job.hosts[1].kill()  # launcher and worker at once, as when the machine dies
    codes = job.wait()
    assert codes["h0"] == 0 and codes["h2"] == 0, job.outputs()
    assert_exact(job, codes)
    epochs = (tmp_path / "run" / "epochs.jsonl").read_text()
    assert "exit:h1-w0" in epochs or "stall:h1-w0" in epochs, epochs


def test_a_partitioned_host_is_fenced_and_the_job_finishes(network, tmp_path):
    job = hosts_job(network, [1, 1, 1], tmp_path / "run")
    job.start(mlp(), extra=["--replica-check-every", "5"])
    job.wait_for_step(100)
    cut = job.hosts[2]
    cut.partition()  # packets dropped both ways: no FIN, no RST
    at = job.progress()
    job.wait_for_step(at + 50, timeout_s=20)  # the others go on without it
    time.sleep(1.0)
    cut.heal()
    codes = job.wait()
    assert codes["h0"] == 0 and codes["h1"] == 0, job.outputs()
    # The cut-off host's launcher either saw its worker rejoin and finish, or exit cleanly.
    assert codes["h2"] in (0, 2), job.outputs()
    assert_exact(job, codes)
    epochs = (tmp_path / "run" / "epochs.jsonl").read_text()
    assert "stall:h2-w0" in epochs, epochs


def test_serving_hosts_workers_killed_under_a_live_authority(network, tmp_path):
    job = hosts_job(network, [1, 1, 1], tmp_path / "run")
    job.start(mlp(), extra=["--replica-check-every", "5"])
    job.wait_for_step(100)
    job.kill_workers(job.serving)
    codes = job.wait()
    assert codes == {"h0": 0, "h1": 0, "h2": 0}, job.outputs()
    assert_exact(job, codes)
    epochs = (tmp_path / "run" / "epochs.jsonl").read_text()
    assert "exit:h0-w0" in epochs, epochs
