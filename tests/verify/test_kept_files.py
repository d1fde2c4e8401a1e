"""The tensor files a worker keeps for audits (`shoal.verify.kept_files`): each kind reads
back exactly, a torch archive (a pickle) is no kept file of any kind, and a
file a worker forged to be something else is refused as unreadable, never loaded."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save

from shoal.verify.kept_files import (UnreadableFile, kept_file_bound, local_bytes, local_from,
                                    params_bytes, params_from, reveal_bytes, reveal_from,
                                    reveal_like)
from shoal.verify.proof_store import ProofStore


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
                                    for k in a)


def test_a_snapshot_reads_back_as_named_tensors(tmp_path):
    store = ProofStore(tmp_path)
    state = {"a.weight": torch.randn(4, 2), "b.bias": torch.randn(3),
             "c.steps": torch.arange(3), "d.half": torch.randn(2).half()}
    store.save_params(5, state)
    assert _equal(store.load_params(5), state)


def test_tied_weights_and_views_of_one_buffer_are_kept_as_their_values():
    flat = torch.arange(6.0)
    tied = {"embed.weight": flat.view(2, 3), "head.weight": flat.view(2, 3)}
    assert _equal(params_from(params_bytes(tied)), tied)
    assert [t.tolist() for t in reveal_from(reveal_bytes([flat[:2], flat[2:]]))] == \
        [[0.0, 1.0], [2.0, 3.0, 4.0, 5.0]]


def test_a_reveal_keeps_its_order_and_a_kept_state_its_optimizer_slots():
    tensors = [torch.randn(3), torch.randn(2, 2), torch.zeros(0)]
    assert all(torch.equal(a, b) for a, b in zip(reveal_from(reveal_bytes(tensors)), tensors,
                                                 strict=True))
    params = {"w": torch.randn(2, 2), "b": torch.randn(2)}
    state = {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2, 2)},
             1: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2), "count": 7}}
    got_params, got_state = local_from(local_bytes(params, state))
    assert _equal(got_params, params)
    assert set(got_state) == {0, 1} and got_state[1]["count"] == 7
    assert all(_equal({k: v for k, v in got_state[i].items() if k != "count"},
                      {k: v for k, v in state[i].items() if k != "count"}) for i in state)


def test_a_file_like_another_takes_only_tensors_of_its_shapes_and_dtypes():
    original = reveal_bytes([torch.ones(2, 2), torch.zeros(3)])
    like = reveal_like(original, [torch.full((2, 2), 2.0), torch.ones(3)])
    assert len(like) == len(original) and like[:16] == original[:16]
    assert [t.tolist() for t in reveal_from(like)] == [[[2.0, 2.0], [2.0, 2.0]], [1.0, 1.0, 1.0]]
    for wrong in ([torch.ones(4), torch.ones(3)], [torch.ones(2, 2).double(), torch.ones(3)],
                  [torch.ones(2, 2)]):
        with pytest.raises(ValueError, match="same shapes and dtypes"):
            reveal_like(original, wrong)


def test_a_torch_archive_in_a_kept_files_place_is_never_unpickled(tmp_path, monkeypatch):
    """A worker that saves its files with torch.save (as shoal once did) hands verifiers
    a pickle: it is no tensor file of any kind, and torch's loader is never run on it."""
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a kept file was unpickled"))
    store = ProofStore(tmp_path)
    for path, value in ((store.layout.params(1), {"w": torch.ones(2)}),
                        (store.layout.reveal("w0", 1), [torch.ones(2)]),
                        (store.layout.local("w0", 1), {"params": {"w": torch.ones(2)}})):
        path.parent.mkdir(parents=True)
        torch.save(value, path)
    assert store.load_params(1) is None
    with pytest.raises(UnreadableFile, match="not a tensor file"):
        store.load_reveal("w0", 1)
    with pytest.raises(UnreadableFile, match="not a tensor file"):
        store.load_local("w0", 1)


# -- forged files ---------------------------------------------------------------------

def _header_lie(data: bytes, **changes) -> bytes:
    """`data` with its header's first tensor entry changed (its length kept by padding)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    name = next(k for k in header if k != "__metadata__")
    header[name].update(changes)
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body + data[8 + size:]


@pytest.mark.parametrize("forged", [
    b"",  # empty
    b"\x00" * 7,  # shorter than a header's length
    (2**40).to_bytes(8, "little") + b"{}",  # a header length past the file
    b"PK\x03\x04 not an archive",  # looks like a torch archive, is not one
    _header_lie(reveal_bytes([torch.ones(4)]), data_offsets=[0, 4096]),  # past the data
    _header_lie(reveal_bytes([torch.ones(4)]), shape=[5]),  # more values than bytes
    _header_lie(reveal_bytes([torch.ones(4)]), dtype="F64"),  # bytes of another dtype
], ids=["empty", "short", "header-past-end", "fake-zip", "offsets", "shape", "dtype"])
def test_a_malformed_file_is_unreadable_for_every_kind(forged):
    for read in (reveal_from, params_from, local_from):
        with pytest.raises(UnreadableFile):
            read(forged)


def test_a_file_of_another_kind_is_not_this_kind():
    reveal = reveal_bytes([torch.ones(2)])
    params = params_bytes({"w": torch.ones(2)})
    with pytest.raises(UnreadableFile, match="0..n-1"):
        reveal_from(params)
    with pytest.raises(UnreadableFile, match="outside"):
        params_from(reveal)
    with pytest.raises(UnreadableFile, match="0..n-1"):  # a gap in the list
        reveal_from(save({"0": torch.ones(1), "2": torch.ones(1)}))
    with pytest.raises(UnreadableFile, match="metadata"):  # a reveal carries nothing else
        reveal_from(save({"0": torch.ones(1)}, {"note": "x"}))
    stray = save({"params/w": torch.ones(1), "elsewhere": torch.ones(1)})
    with pytest.raises(UnreadableFile, match="neither"):
        local_from(stray)
    for scalars in ['{"optimizer/0/step": "1"}', '{"params/w": 1}', "[1]", "not json",
                    '{"optimizer/0/step": NaN}', '{"optimizer/x/step": 1}']:
        with pytest.raises(UnreadableFile):
            local_from(save({"params/w": torch.ones(1)}, {"scalars": scalars}))
    twice = save({"params/w": torch.ones(1), "optimizer/0/step": torch.ones(())},
                 {"scalars": '{"optimizer/0/step": 1}'})  # one slot as a tensor and a scalar
    with pytest.raises(UnreadableFile, match="malformed"):
        local_from(twice)


def test_a_store_calls_a_forged_reveal_unreadable_and_a_forged_snapshot_absent(tmp_path):
    store = ProofStore(tmp_path)
    store.layout.reveal("w0", 3).parent.mkdir(parents=True)
    store.layout.reveal("w0", 3).write_bytes(b"\x08" + b"\x00" * 7 + b"{\"a\":1}")
    with pytest.raises(UnreadableFile, match="w0's file for step 3"):
        store.load_reveal("w0", 3)
    store.layout.params(3).parent.mkdir(parents=True)
    store.layout.params(3).write_bytes(b"garbage")
    assert store.load_params(3) is None and store.load_reveal("w0", 4) is None


def test_a_file_past_the_models_bound_is_not_read(tmp_path):
    from shoal.models.model import GPT  # the job's model, as a verifier builds it
    from shoal.spec.job import ModelSpec

    model = GPT(ModelSpec(layers=1, heads=2, width=32, context=32))
    optimizer = torch.optim.AdamW(model.parameters(), amsgrad=True)
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    bound = kept_file_bound(model)
    honest = local_bytes(model.state_dict(), optimizer.state_dict()["state"])
    assert len(honest) * 2 < bound  # an honest kept state, AMSGrad's third moment and all

    store = ProofStore(tmp_path)
    store.limit_file_bytes(bound)
    store.save_local("w0", 1, model.state_dict(), optimizer.state_dict()["state"])
    assert store.load_local("w0", 1) is not None
    for path in (store.layout.reveal("w0", 2), store.layout.local("w0", 2), store.layout.params(2)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(reveal_bytes([torch.zeros(bound // 4)]))  # past the bound
    with pytest.raises(UnreadableFile, match="more than"):
        store.load_reveal("w0", 2)
    with pytest.raises(UnreadableFile, match="more than"):
        store.load_local("w0", 2)
    assert store.load_params(2) is None
