import json

import pytest
import torch

from shoal.train.checkpoint import CheckpointStore, restore_snapshot, take_snapshot
from shoal.train.errors import CheckpointError

IDENTITY = {"seed": 1, "model": {"width": 8}}


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _write(store, step, model, optimizer):
    store.save_async(take_snapshot(step, step * 10, model, optimizer))
    store.wait()


def test_roundtrip_restores_model_optimizer_rng_and_cursor(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    store = CheckpointStore(tmp_path, IDENTITY)
    torch.manual_seed(123)
    _write(store, 5, model, optimizer)
    expected_draw = torch.rand(3)
    store.close()

    other, other_opt = _model_and_optimizer(1)
    snapshot = CheckpointStore(tmp_path, IDENTITY).load_latest()
    restore_snapshot(snapshot, other, other_opt)
    assert (snapshot.step, snapshot.cursor) == (5, 50)
    assert torch.equal(other.weight, model.weight)
    assert other_opt.state_dict()["state"][0]["exp_avg"].equal(optimizer.state_dict()["state"][0]["exp_avg"])
    assert torch.equal(torch.rand(3), expected_draw)


def test_snapshot_is_detached_from_live_training(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    snapshot = take_snapshot(1, 0, model, optimizer)
    before = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    assert torch.equal(snapshot.state["model"]["weight"], before)


def test_damaged_newest_falls_back_to_previous(tmp_path, caplog):
    model, optimizer = _model_and_optimizer(0)
    store = CheckpointStore(tmp_path, IDENTITY, keep=3)
    _write(store, 1, model, optimizer)
    _write(store, 2, model, optimizer)
    store.close()
    payload = tmp_path / "step-0000000002.safetensors"
    blob = bytearray(payload.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    payload.write_bytes(bytes(blob))
    snapshot = CheckpointStore(tmp_path, IDENTITY).load_latest()
    assert snapshot.step == 1
    assert "damaged" in caplog.text


def test_half_written_checkpoint_is_ignored(tmp_path):
    """A kill between payload and manifest leaves a payload with no manifest."""
    model, optimizer = _model_and_optimizer(0)
    store = CheckpointStore(tmp_path, IDENTITY)
    _write(store, 4, model, optimizer)
    store.close()
    (tmp_path / "step-0000000009.safetensors.tmp").write_bytes(b"partial")
    (tmp_path / "step-0000000008.safetensors").write_bytes(b"no manifest yet")
    assert CheckpointStore(tmp_path, IDENTITY).load_latest().step == 4


def test_all_damaged_is_an_error_that_says_what_to_do(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    store = CheckpointStore(tmp_path, IDENTITY)
    _write(store, 1, model, optimizer)
    store.close()
    (tmp_path / "step-0000000001.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="damaged.*--fresh"):
        CheckpointStore(tmp_path, IDENTITY).load_latest()


def test_checkpoint_of_another_job_is_refused(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    store = CheckpointStore(tmp_path, IDENTITY)
    _write(store, 1, model, optimizer)
    store.close()
    with pytest.raises(CheckpointError, match="different job.*model"):
        CheckpointStore(tmp_path, {"seed": 1, "model": {"width": 16}}).load_latest()


def test_keeps_only_the_newest(tmp_path):
    model, optimizer = _model_and_optimizer(0)
    store = CheckpointStore(tmp_path, IDENTITY, keep=2)
    for step in range(1, 6):
        _write(store, step, model, optimizer)
    store.close()
    manifests = sorted(p.name for p in tmp_path.glob("*.json"))
    assert manifests == ["step-0000000004.json", "step-0000000005.json"]
    assert len(list(tmp_path.glob("*.safetensors"))) == 2
    assert json.loads((tmp_path / manifests[-1]).read_text())["step"] == 5


def test_save_does_not_wait_for_the_disk(tmp_path, monkeypatch):
    """save_async returns while a slow write is still in progress."""
    import threading

    import shoal.train.checkpoint as checkpoint

    release = threading.Event()
    real = checkpoint.write_checkpoint

    def slow_write(*args, **kwargs):
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "write_checkpoint", slow_write)
    model, optimizer = _model_and_optimizer(0)
    store = CheckpointStore(tmp_path, IDENTITY)
    store.save_async(take_snapshot(1, 0, model, optimizer))
    assert store.latest_step() is None  # not on disk yet, and we were not blocked
    release.set()
    store.close()
    assert store.latest_step() == 1 and store.written == 1
