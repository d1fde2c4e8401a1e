"""`precision = "bf16"` in a job file: the forward pass runs in bfloat16
autocast, parameters and updates stay float32, and the model still learns."""

from __future__ import annotations

import math

import pytest

from shoal.spec import Precision, parse_job
from shoal.models.single import train_job
from tests.conftest import tiny_job_toml


def _job(tmp_path, precision: str):
    import tomllib

    values = tomllib.loads(tiny_job_toml(tmp_path / f"ckpt-{precision}", steps=30))
    values["precision"] = precision
    return parse_job(values)


@pytest.mark.slow
def test_a_bf16_job_runs_its_forward_in_bf16_and_still_learns(tmp_path):
    job = _job(tmp_path, "bf16")
    assert job.precision is Precision.bf16
    bf16 = train_job(job, show_progress=False)
    assert bf16.val_loss is not None and math.isfinite(bf16.val_loss)
    assert bf16.val_loss < math.log(256)  # better than guessing bytes uniformly
    fp32 = train_job(_job(tmp_path, "fp32"), show_progress=False)
    assert fp32.param_sha256 != bf16.param_sha256  # the arithmetic really changed
