"""`shoal verify`: a clean job passes (exit 0), a cheat is named (exit 1), and a
user mistake is one line (exit 2)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import shoal_command
from tests.verify.roles.conftest import run_proven_job, write_proven_job


@pytest.mark.slow
def test_verify_names_the_cheat_and_exits_1(tmp_path, cli_env):
    proven = run_proven_job(tmp_path, workers=2, steps=6, epoch_steps=3,
                            adversaries={1: "scale"})
    job_file = str(tmp_path / "job.toml")
    done = subprocess.run(shoal_command("verify", job_file, "--json", "--salt", "00ff"),
                          capture_output=True, text=True, env=cli_env, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["guilty"] == {"w1": "wrong_contribution"} and report["epochs"] == [0, 1]
    assert report["salt"] == "00ff"
    human = subprocess.run(shoal_command("verify", job_file, "--all"), capture_output=True,
                           text=True, env=cli_env, timeout=120)
    assert human.returncode == 1 and "cheating: w1" in human.stdout
    assert proven.store.records()


def test_verify_without_records_is_one_line(tmp_path, cli_env):
    job = tmp_path / "job.toml"
    job.write_text(f'steps = 3\nglobal_batch = 2\n[proof]\nenabled = true\ndir = "{tmp_path}/none"\n')
    done = subprocess.run(shoal_command("verify", str(job)), capture_output=True, text=True,
                          env=cli_env, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "enabled = true" in done.stderr


@pytest.mark.slow
def test_verify_follows_a_running_job_to_its_last_epoch(tmp_path, cli_env):
    job_file = write_proven_job(tmp_path, steps=6, epoch_steps=3)
    follower = subprocess.Popen(
        shoal_command("verify", str(job_file), "--follow", "--interval-s", "0.3", "--json"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env)
    try:
        run_proven_job(tmp_path, workers=2, steps=6, epoch_steps=3, adversaries={0: "zero"})
        out, err = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert follower.returncode == 1, err[-2000:]
    report = json.loads(out)
    assert report["epochs"] == [0, 1] and report["guilty"] == {"w0": "wrong_contribution"}
