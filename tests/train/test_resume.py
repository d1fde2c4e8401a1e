"""Exact resume: SIGKILL at random steps, resume, and the parameters match bit for bit."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import shoal_command, tiny_job_toml

pytestmark = pytest.mark.slow

STEPS = 120


def _latest_step(directory: Path) -> int:
    steps = [int(p.stem.split("-")[1]) for p in directory.glob("step-*.json")]
    return max(steps, default=0)


def _train(job: Path, report: Path, env: dict, *extra: str) -> dict:
    subprocess.run(shoal_command("train", str(job), "-q", "--report", str(report), *extra),
                   check=True, env=env, capture_output=True, timeout=300)
    return json.loads(report.read_text())


def _kill_at_step(job: Path, directory: Path, target: int, env: dict, *extra: str) -> int:
    """Start training, SIGKILL it as soon as a checkpoint at or past `target` exists."""
    process = subprocess.Popen(shoal_command("train", str(job), "-q", *extra), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while _latest_step(directory) < target and process.poll() is None:
        assert time.monotonic() < deadline, "training made no progress"
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return _latest_step(directory)


def test_sigkill_at_random_steps_then_resume_is_bit_identical(tmp_path, cli_env):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    reference_job = tmp_path / "reference.toml"
    reference_job.write_text(tiny_job_toml(tmp_path / "ref-ckpt", steps=STEPS))
    killed_job = tmp_path / "killed.toml"
    killed_dir = tmp_path / "killed-ckpt"
    killed_job.write_text(tiny_job_toml(killed_dir, steps=STEPS))

    reference = _train(reference_job, tmp_path / "reference.json", cli_env)

    first, second = sorted(rng.sample(range(3, STEPS - 3), 2))
    reached = _kill_at_step(killed_job, killed_dir, first, cli_env)
    reached = _kill_at_step(killed_job, killed_dir, max(second, reached + 1), cli_env, "--resume")
    resumed = _train(killed_job, tmp_path / "resumed.json", cli_env, "--resume")

    note = f"(kills near steps {first} and {second}, random seed {seed})"
    assert resumed["steps"] == reference["steps"] == STEPS, note
    assert resumed["start_step"] > 0, note
    assert resumed["param_sha256"] == reference["param_sha256"], note
    assert resumed["val_loss"] == reference["val_loss"], note


def test_damaged_checkpoint_resumes_from_the_previous_one_exactly(tmp_path, cli_env):
    job = tmp_path / "job.toml"
    directory = tmp_path / "ckpt"
    job.write_text(tiny_job_toml(directory, steps=30))  # the newest checkpoints are kept
    finished = _train(job, tmp_path / "finished.json", cli_env)
    # The one before 30 is 27, unless a loaded disk let 30 supersede it before it was
    # written (the writer keeps only the newest pending checkpoint): then 24.
    kept = sorted(int(p.stem.split("-")[1]) for p in directory.glob("step-*.json"))
    assert kept[-1] == 30 and len(kept) >= 2
    newest = directory / "step-0000000030.safetensors"
    newest.write_bytes(newest.read_bytes()[:-10] + b"0123456789")
    resumed = _train(job, tmp_path / "resumed.json", cli_env, "--resume")
    assert resumed["start_step"] == kept[-2]  # 30 was damaged
    assert resumed["param_sha256"] == finished["param_sha256"]
