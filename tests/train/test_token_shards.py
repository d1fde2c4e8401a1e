"""Token shards read by URL (issue 41): against a real S3 API (moto's server, on
loopback) and local files, each sample the window it names, batches read as byte
ranges of the shards, never the whole set."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from fsspec.implementations.local import LocalFileSystem

from shoal.train.errors import TrainError
from shoal.train.token_shards import TokenShards
from tests.conftest import shoal_command
from tests.harness.s3 import aws_env, s3_bucket

REPO = Path(__file__).resolve().parents[2]

CONTEXT = 8


def _shards(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50257, size=n, dtype=np.uint16) for n in (1000, 77, 4097)]


def _expected(shards: list[np.ndarray], context: int) -> list[np.ndarray]:
    """Every window of context + 1 tokens, shard by shard, none crossing a shard's end."""
    return [s[i * context: i * context + context + 1] for s in shards
            for i in range((len(s) - 1) // context)]


def shard_objects() -> dict[str, bytes]:
    """The corpus as its bucket holds it: three shards of token ids."""
    return {f"tokens/train-{i:03d}.bin": shard.tobytes() for i, shard in enumerate(_shards())}


@pytest.fixture(scope="module")
def s3():
    """A bucket on moto's S3 server on loopback, and the options that reach it."""
    with s3_bucket("corpus", shard_objects()) as options:
        yield options


def test_windows_from_s3_are_the_shards_own_in_order(s3):
    data = TokenShards("s3://corpus/tokens/train-*.bin", CONTEXT, storage_options=s3)
    expected = _expected(_shards(), CONTEXT)
    assert len(data) == len(expected) == 124 + 9 + 512
    ids = np.array([0, 123, 124, 132, 133, len(expected) - 1, 7, 7])
    x, y = data.get_batch(ids)
    assert x.shape == y.shape == (len(ids), CONTEXT) and x.dtype == torch.int64
    for row, i in enumerate(ids):
        assert x[row].tolist() == expected[i][:-1].tolist()
        assert y[row].tolist() == expected[i][1:].tolist()
    one_x, one_y = data[133]
    assert one_x.tolist() == expected[133][:-1].tolist()


def test_a_missing_shard_or_a_ragged_one_is_said(s3, tmp_path):
    with pytest.raises(TrainError, match="no token shards match"):
        TokenShards("s3://corpus/elsewhere/*.bin", CONTEXT, storage_options=s3)
    with pytest.raises(TrainError, match="no token shard at"):
        TokenShards("s3://corpus/tokens/none.bin", CONTEXT, storage_options=s3)
    (tmp_path / "odd.bin").write_bytes(b"\0" * 7)
    with pytest.raises(TrainError, match="not whole uint16 tokens"):
        TokenShards(str(tmp_path / "odd.bin"), CONTEXT)


class _Counting(LocalFileSystem):
    """The local filesystem, counting the bytes it hands out."""

    served = 0

    def cat_file(self, path, start=None, end=None, **kwargs):  # noqa: ANN001, ANN201
        data = super().cat_file(path, start=start, end=end, **kwargs)
        _Counting.served += len(data)
        return data


def test_a_batch_reads_its_samples_bytes_and_no_more(tmp_path, monkeypatch):
    shard = np.arange(1 << 20, dtype=np.uint32) % 60000  # 4 MiB
    (tmp_path / "big.bin").write_bytes(shard.tobytes())
    data = TokenShards(str(tmp_path / "big.bin"), 256, dtype="uint32")
    monkeypatch.setattr(data, "_fs", _Counting(skip_instance_cache=True))
    _Counting.served = 0
    x, _ = data.get_batch(np.array([5, 4000, 17]))
    assert x[1, 0].item() == 4000 * 256 % 60000
    assert _Counting.served == 3 * 257 * 4  # three windows, of 4 MiB


def test_a_split_holds_out_the_last_windows(tmp_path):
    (tmp_path / "t.bin").write_bytes(np.arange(801, dtype=np.uint16).tobytes())
    train, held = TokenShards(str(tmp_path / "t.bin"), 8).split(10)
    assert (len(train), len(held)) == (90, 10)
    assert held.get_batch(np.array([0]))[0][0, 0].item() == 90 * 8
    with pytest.raises(IndexError):
        train.get_batch(np.array([90]))


@pytest.mark.slow
def test_shoal_run_trains_from_s3_exactly_through_a_kill(s3, tmp_path, cli_env):
    """The user's loop (examples/token_lm.py) on two workers reading the bucket, one killed
    mid-run: no sample skipped or seen twice, and the held-out loss of the run on one
    worker (the same samples in the same order)."""
    env = {**cli_env, **aws_env(s3)}
    reports = {}
    for workers, chaos in ((2, ["--chaos", "kill:1@step20"]), (1, [])):
        report = tmp_path / f"report-{workers}.json"
        done = subprocess.run(
            shoal_command("run", "examples/token_lm.py", "--workers", str(workers), *chaos,
                          "--run-dir", str(tmp_path / f"run{workers}"), "--report", str(report),
                          "--", "--data", "s3://corpus/tokens/train-*.bin", "--context", "8",
                          "--steps", "40", "--vocab", "50304"),
            env=env, capture_output=True, text=True, cwd=REPO, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        reports[workers] = json.loads(report.read_text())
    two = reports[2]
    assert two["steps"] == 40 and two["samples_skipped"] == two["samples_duplicated"] == 0
    assert [f["kind"] for f in two["faults"]] == ["kill"]
    assert two["val_loss"] == pytest.approx(reports[1]["val_loss"], abs=1e-3)
