"""Parameter snapshots are written packed (a few flat tensors: the safe loader's cost
is per tensor, and an every-step audit loads one per audited step), read back
exactly, and a file that does not unpack is no snapshot."""

from __future__ import annotations

import torch

from shoal.train.packing import pack
from shoal.train.proof_store import ProofStore


def test_a_snapshot_reads_back_as_named_tensors(tmp_path):
    store = ProofStore(tmp_path)
    state = {"a.weight": torch.randn(4, 2), "b.bias": torch.randn(3),
             "c.steps": torch.arange(3), "d.half": torch.randn(2).half()}
    store.save_params(5, state)
    loaded = store.load_params(5)
    assert list(loaded) == list(state)
    assert all(loaded[k].dtype == state[k].dtype and torch.equal(loaded[k], state[k])
               for k in state)


def test_snapshots_written_before_packing_still_read(tmp_path):
    store = ProofStore(tmp_path)
    store.params_path(1).parent.mkdir(parents=True)
    torch.save({"w": torch.ones(2)}, store.params_path(1))
    assert store.load_params(1)["w"].tolist() == [1.0, 1.0]


def test_a_snapshot_that_does_not_unpack_is_not_a_snapshot(tmp_path):
    store = ProofStore(tmp_path)
    store.params_path(2).parent.mkdir(parents=True)
    overrun = {"keys": ["w"], "shapes": [[9]], "dtypes": ["float32"], "scalars": {},
               "flat": {"float32": torch.ones(2)}}
    torch.save(overrun, store.params_path(2))
    assert store.load_params(2) is None
    torch.save(pack({"w": torch.ones(2)}, {"stray": 1}), store.params_path(2))
    assert store.load_params(2) is None
