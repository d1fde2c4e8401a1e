"""Issue 40, point 3: a training state from another party crosses only as a state
file (safetensors, its shape as JSON in the header), never as a torch archive.

A torch archive is a zip that `torch.load(weights_only=True)` inflates before anything
looks at it: a 66 kB archive becomes 64 MiB (1000:1; a 256 MiB upload would be 256 GB).
Tried as a provider would: a checkpoint upload, a carried checkpoint on a worker's disk,
and a live state sent to joiners. Before: torch loads the bomb. Now: each is refused
unread, while an honest state (model, AdamW, RNG, DiLoCo's outer state) comes back
exactly as it went in."""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile

import pytest
import torch
from safetensors.torch import save as save_safetensors

from shoal.spec.errors import SpecError
from shoal.train.checkpoint import CheckpointStore, take_snapshot
from shoal.train.files import CHECKPOINT_FORMAT, payload_name
from shoal.train.group import GroupFailed
from shoal.train.inject import InjectedFaults
from shoal.train.live_state import pack, unpack
from shoal.train.membership import _transfer
from shoal.train.state_file import StateFileError, decode, encode

HONEST_STATE = {"model": {"w": torch.zeros(64 << 20, dtype=torch.uint8)}, "step": 3, "cursor": 24}


def saved(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def deflated(data: bytes) -> bytes:
    """The same archive with every entry deflated."""
    source, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as bomb:
        for info in source.infolist():
            bomb.writestr(info.filename, source.read(info.filename))
    return out.getvalue()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = deflated(saved(HONEST_STATE))
    assert len(data) < (1 << 20)  # it travels as less than a megabyte...
    inflated = torch.load(io.BytesIO(data), weights_only=True)  # ...and torch reads it
    assert inflated["model"]["w"].numel() == 64 << 20  # as 64 MiB: the premise holds
    return data


def _trained_state() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model[1].weight = model[0].weight  # tied: two names, one storage (safetensors refuses)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.9))
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return {**take_snapshot(7, 84, model, optimizer).state, "step": 7, "cursor": 84,
            "guard": {"recent": [1.5, float("inf")], "bad_streak": 0, "skipped": None},
            "extras": {"diloco": {"outer": torch.ones(3, dtype=torch.bfloat16),
                                  "round_expected": 2}}}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def test_an_honest_state_comes_back_exactly():
    state = _trained_state()
    back = decode(encode(state), 1 << 30)
    assert _same(state, back)
    assert isinstance(back["optimizer"]["param_groups"][0]["betas"], tuple)
    assert 0 in back["optimizer"]["state"]  # integer keys stay integers
    torch.set_rng_state(back["rng"])  # the RNG's bytes are the RNG's
    assert math.isnan(decode(encode({"x": float("nan")}), 1 << 20)["x"])


def test_what_a_state_file_cannot_hold_is_refused_with_its_path():
    with pytest.raises(StateFileError, match="/model/w: a set"):
        encode({"model": {"w": {1, 2}}})
    with pytest.raises(StateFileError, match="a key of type tuple"):
        encode({(1, 2): 3})


def test_a_torch_archive_or_junk_is_no_state_file(bomb):
    for data in (bomb, saved({"step": 1}), b"", b"not a file", b"\xff" * 8 + b"{}"):
        with pytest.raises(StateFileError, match="not a state file"):
            decode(data, 1 << 30)
    honest = encode({"step": 1})
    with pytest.raises(StateFileError, match="at most"):
        decode(honest, len(honest) - 1)


def _forged(shape: object) -> bytes:
    text = shape if isinstance(shape, str) else json.dumps(shape)
    return save_safetensors({"0": torch.ones(2)}, {"shoal.state/1": text})


@pytest.mark.parametrize("shape, why", [
    ({"t": "1"}, "malformed"),  # a tensor the file does not hold
    ({"l": [{"t": "0"}, {"t": "0"}]}, "malformed"),  # one tensor named twice
    ({"d": [["a", 1]]}, "does not name"),  # a tensor the shape leaves out
    ({"d": [["a", {"t": "0"}], ["a", 2]]}, "dict entry"),  # a key given twice
    ({"d": [[{"t": "0"}, 1]]}, "dict entry"),  # a key that is not a scalar
    ({"x": [], "t": "0"}, "malformed"),
    ({"q": 1}, "malformed"),
])
def test_a_forged_shape_is_refused(shape, why):
    with pytest.raises(StateFileError, match=why):
        decode(_forged(shape), 1 << 20)


def test_a_shape_nested_past_any_state_is_refused():
    for depth in (40, 100_000):  # past the reader's bound; past Python's own
        deep = '{"l": [' * depth + '{"t": "0"}' + "]}" * depth
        with pytest.raises(StateFileError, match="deeper|not a state file"):
            decode(_forged(deep), 1 << 30)


def test_a_bomb_uploaded_as_a_checkpoint_is_refused(bomb):
    """The coordinator's checkpoint upload (a provider carrying a job's state)."""
    from shoal.coordinator.services.checkpoints import _load

    with pytest.raises(SpecError, match="not a state file"):
        _load(bomb, step=3)
    with pytest.raises(SpecError, match="not a state file"):
        _load(saved({"step": 3, "cursor": 24, "model": {}}), step=3)  # even an honest archive
    assert _load(encode({"step": 3, "cursor": 24, "model": {"w": torch.ones(2)}}),
                 step=3)["cursor"] == 24


def _place(folder, step: int, payload: bytes, fmt: int = CHECKPOINT_FORMAT) -> None:
    (folder / payload_name(step)).write_bytes(payload)
    (folder / f"step-{step:010d}.json").write_text(json.dumps(
        {"format": fmt, "step": step, "payload": payload_name(step), "bytes": len(payload),
         "sha256": hashlib.sha256(payload).hexdigest(), "identity": {}}))


def test_a_bomb_on_disk_as_a_carried_checkpoint_is_passed_over(tmp_path, bomb):
    """A checkpoint the coordinator carried from another provider: a worker restoring
    from it refuses the bomb (as either format) and falls back to the previous one."""
    store = CheckpointStore(tmp_path, identity={})
    _place(tmp_path, 2, encode({"step": 2, "cursor": 16, "model": {"w": torch.ones(2)}}))
    _place(tmp_path, 3, bomb)
    _place(tmp_path, 4, bomb, fmt=1)
    _place(tmp_path, 5, encode({"step": 4, "cursor": 40, "model": {}}))  # not its name's step
    snapshot = store.load_latest()
    assert (snapshot.step, snapshot.cursor) == (2, 16)
    store.close()


def test_a_live_state_bomb_is_refused_by_every_joiner(bomb):
    """Sent by an epoch's state source in place of its state, with the right hash."""
    blob = torch.frombuffer(bytearray(bomb), dtype=torch.uint8)
    with pytest.raises(ValueError, match="not a state file"):
        unpack(blob, hashlib.sha256(bomb).hexdigest(), limit=1 << 30)
    honest = pack({"step": 1, "w": torch.ones(4)})
    assert unpack(honest.blob, honest.sha256, limit=1 << 20)["step"] == 1


class _Header:
    """A store whose state header announces `size` bytes (the source's word)."""

    def __init__(self, size: object) -> None:
        self.store = self
        self._value = json.dumps({"sha256": "0" * 64, "bytes": size}).encode()

    def wait_keys(self, keys, timeout_s):  # noqa: ANN001, ANN201 - the Rendezvous calls used
        return True

    def get(self, key):  # noqa: ANN001, ANN201
        return self._value


@pytest.mark.parametrize("size", [1 << 40, -1, 0, "1e12", None])
def test_a_state_header_announcing_a_terabyte_allocates_nothing(size):
    """Before: every joiner ran torch.empty(header['bytes']) on the source's word."""
    with pytest.raises(GroupFailed, match="refused"):
        _transfer(_Header(size), group=None, epoch=4, rank=1, source=0, poll_s=0.1,
                  newer=lambda: False, live_state=dict, load_state=lambda state: None,
                  limit=1 << 30, faults=InjectedFaults())
