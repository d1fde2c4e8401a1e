"""A user mistake gets one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import shoal_command, tiny_job_toml


def _run(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(shoal_command(*args), capture_output=True, text=True, timeout=120, env=env)


def _assert_one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("shoal: error:")]
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("steps = = 1", "malformed TOML"),
        ("steps = 5\nglobal_batch = 4\ncolour = 3", "unknown key 'colour'"),
        ("steps = 5\nglobal_batch = 0", "'global_batch' = 0: out of range (allowed 1 to 1048576)"),
        ("steps = 5\nglobal_batch = 4\n[model]\nheads = 3", "multiple of model.heads"),
    ],
)
def test_bad_job_files(tmp_path, content, fragment):
    job = tmp_path / "job.toml"
    job.write_text(content)
    _assert_one_line_error(_run("train", str(job)), fragment)


def test_missing_job_file(tmp_path):
    _assert_one_line_error(_run("train", str(tmp_path / "absent.toml")), "not found")


def test_empty_corpus(tmp_path):
    (tmp_path / "texts").mkdir()
    job = tmp_path / "job.toml"
    job.write_text(f'steps = 5\nglobal_batch = 4\n[data]\ncorpus = "{tmp_path / "texts"}"\n')
    _assert_one_line_error(_run("train", str(job)), "is empty")


@pytest.mark.slow
@pytest.mark.parallel_ok  # one process at a time, each run to its end: nothing races a deadline
def test_checkpoint_guards(tmp_path, cli_env):
    job = tmp_path / "job.toml"
    job.write_text(tiny_job_toml(tmp_path / "ckpt", steps=6))
    assert _run("train", str(job), "-q", env=cli_env).returncode == 0
    # Existing checkpoints are never overwritten silently.
    _assert_one_line_error(_run("train", str(job), "-q", env=cli_env), "--resume")
    # A checkpoint from a different model is refused, naming the difference.
    job.write_text(tiny_job_toml(tmp_path / "ckpt", steps=6).replace("width = 32", "width = 64"))
    _assert_one_line_error(_run("train", str(job), "--resume", "-q", env=cli_env), "different job")
    # Every checkpoint damaged: say so, and how to start over.
    for payload in (tmp_path / "ckpt").glob("*.safetensors"):
        payload.write_bytes(b"junk")
    job.write_text(tiny_job_toml(tmp_path / "ckpt", steps=6))
    _assert_one_line_error(_run("train", str(job), "--resume", "-q", env=cli_env), "damaged")
    assert _run("train", str(job), "--fresh", "-q", env=cli_env).returncode == 0


@pytest.mark.slow
def test_elastic_train_resumes_from_disk_with_another_world_size(tmp_path, cli_env):
    job = tmp_path / "job.toml"
    job.write_text(tiny_job_toml(tmp_path / "ckpt", steps=20))
    first = _run("train", str(job), "--workers", "2", "--run-dir", str(tmp_path / "a"), env=cli_env)
    assert first.returncode == 0, first.stderr[-2000:]
    _assert_one_line_error(_run("train", str(job), "--workers", "3", env=cli_env), "--resume")
    second = _run("train", str(job), "--workers", "3", "--steps", "30", "--resume",
                  "--run-dir", str(tmp_path / "b"), "--report", str(tmp_path / "b.json"), env=cli_env)
    assert second.returncode == 0, second.stderr[-2000:]
    logs = "".join(p.read_text() for p in (tmp_path / "b").glob("w*.log"))
    assert "restored step 20" in logs
    report = __import__("json").loads((tmp_path / "b.json").read_text())
    assert report["steps"] == 10 and report["samples_skipped"] == 0


def test_a_rendezvous_pass_that_does_not_parse(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(tiny_job_toml(tmp_path))
    env = {**os.environ, "SHOAL_RENDEZVOUS_PASS": '{"identity": "lease:1", "token": "xyz"}'}
    _assert_one_line_error(_run("train", str(job), "--workers", "1", "--rendezvous",
                                "127.0.0.1:9", env=env), "SHOAL_RENDEZVOUS_PASS is not a rendezvous pass")


def test_a_gate_that_refuses_the_pass_is_said_at_start(tmp_path):
    """A pass made from another gate's keys (`shoal rendezvous-pass`, as a host's operator
    would) for a gated host: the launcher says the gate did not admit it, before any worker
    starts, not as a store that times out later."""
    from shoal.elastic.job_host import JobHostConfig, _serve

    server, gate, host = _serve(JobHostConfig(bind="127.0.0.1", port=0, run_dir=tmp_path / "run",
                                               gate_dir=tmp_path / "gate"))
    try:
        made = _run("rendezvous-pass", str(tmp_path / "other"), "host-b")
        assert made.returncode == 0, made.stderr
        job = tmp_path / "job.toml"
        job.write_text(tiny_job_toml(tmp_path))
        env = {**os.environ, "SHOAL_RENDEZVOUS_PASS": made.stdout.strip()}
        _assert_one_line_error(_run("train", str(job), "--workers", "1", "--rendezvous",
                                    host["endpoint"], "--run-dir", str(tmp_path / "w"), env=env),
                               "another certificate")
        made = _run("rendezvous-pass", str(tmp_path / "gate"), "host-b")  # the host's own keys
        from shoal.spec.coordinator import RendezvousPass
        assert RendezvousPass.model_validate_json(made.stdout).cert_sha256 == host["cert_sha256"]
    finally:
        gate.close()
        server.close()
