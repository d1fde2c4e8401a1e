"""Issue 40, point 3: a torch archive from another party is a decompression bomb
waiting for `torch.load`. Tried as a provider would: a checkpoint upload, a carried
checkpoint on a worker's disk, and a live state sent to joiners, each a 66 kB archive
that torch inflates to 64 MiB (1000:1; a 256 MiB upload would be 256 GB). Before: torch
loads it. Now: refused on its zip directory, before anything is inflated, and honest
archives (torch.save's, which stores entries) still load."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
import torch

from shoal.spec.errors import SpecError
from shoal.train.archives import ArchiveError, check_archive
from shoal.train.group import GroupFailed
from shoal.train.inject import InjectedFaults
from shoal.train.live_state import pack, unpack
from shoal.train.membership import _transfer

HONEST_STATE = {"model": {"w": torch.zeros(64 << 20, dtype=torch.uint8)}, "step": 3, "cursor": 24}


def saved(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def deflated(data: bytes) -> bytes:
    """The same archive with every entry deflated: what torch.save never writes."""
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


def test_a_bomb_is_refused_before_anything_is_inflated(bomb):
    with pytest.raises(ArchiveError, match="compressed"):
        check_archive(bomb, len(bomb))
    honest = saved(HONEST_STATE)
    check_archive(honest, len(honest))  # torch.save's own archives pass
    with pytest.raises(ArchiveError, match="at most"):
        check_archive(honest, len(honest) - 1)
    for junk in (b"", b"not a zip", b"PK\x03\x04" + b"\x00" * 100):
        with pytest.raises(ArchiveError, match="not a torch archive"):
            check_archive(junk, 1 << 20)


def test_a_bomb_uploaded_as_a_checkpoint_is_refused(bomb):
    """The coordinator's checkpoint upload (a provider carrying a job's state)."""
    from shoal.coordinator.services.checkpoints import _load

    with pytest.raises(SpecError, match="compressed"):
        _load(bomb, step=3)
    assert _load(saved(HONEST_STATE), step=3)["cursor"] == 24


def test_a_bomb_on_disk_as_a_carried_checkpoint_is_passed_over(tmp_path, bomb):
    """A checkpoint the coordinator carried from another provider: a worker restoring
    from it refuses the bomb and falls back (here: to nothing)."""
    import hashlib

    from shoal.train.checkpoint import CheckpointStore

    store = CheckpointStore(tmp_path, identity={})
    (tmp_path / "step-0000000003.pt").write_bytes(bomb)
    (tmp_path / "step-0000000003.json").write_text(json.dumps(
        {"format": 1, "step": 3, "payload": "step-0000000003.pt", "bytes": len(bomb),
         "sha256": hashlib.sha256(bomb).hexdigest(), "identity": {}}))
    assert store._load_verified(tmp_path / "step-0000000003.json") is None


def test_a_live_state_bomb_is_refused_by_every_joiner(bomb):
    """Sent by an epoch's state source in place of its state, with the right hash."""
    import hashlib

    blob = torch.frombuffer(bytearray(bomb), dtype=torch.uint8)
    with pytest.raises(ValueError, match="compressed"):
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
