"""Shared fixtures: small jobs that train in seconds on two cores."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from tests.harness import network  # noqa: F401  (the namespaced-hosts fixture)

REPO = Path(__file__).resolve().parents[1]


def tiny_job_toml(checkpoint_dir: Path, interval_steps: int = 3, **top: object) -> str:
    """A job file for a model small enough to train dozens of steps in seconds."""
    values = {"name": "tiny", "seed": 7, "steps": 40, "global_batch": 8,
              "eval_interval": 20, "eval_batches": 2, **top}
    head = "\n".join(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
                     for k, v in values.items())
    return f"""{head}
[model]
layers = 1
heads = 2
width = 32
context = 32
[data]
corpus = "stdlib"
max_bytes = 300000
[optimizer]
lr = 0.003
[schedule]
warmup_steps = 5
[checkpoint]
dir = "{checkpoint_dir}"
interval_steps = {interval_steps}
keep = 2
"""


@pytest.fixture
def tiny_job(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_job_toml(tmp_path / "ckpt"))
    return path


def free_port() -> int:
    """A TCP port nothing on loopback listens on now (for a server a test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shoal_command(*args: str) -> list[str]:
    """Run the CLI in a fresh interpreter, as a user would."""
    return [sys.executable, "-m", "shoal.cli.main", *args]


@pytest.fixture
def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # same thread count in every run: same float order
    return env

