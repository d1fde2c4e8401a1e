"""A worker's kept state, packed into a few tensors: it round-trips bit for bit, and
a file the worker under audit forged to mislead the reader is refused, not read."""

from __future__ import annotations

import pytest
import torch

from shoal.train.hashing import optimizer_state_sha256
from shoal.train.packing import PackError, pack, pack_optimizer_state, unpack, unpack_optimizer_state


def adam_state():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model.state_dict(), optimizer.state_dict()["state"]


def test_a_state_round_trips_bit_for_bit():
    params, state = adam_state()
    tensors, scalars = unpack(pack(params))
    assert scalars == {} and list(tensors) == list(params)
    assert all(torch.equal(tensors[k], params[k]) for k in params)
    back = unpack_optimizer_state(pack_optimizer_state(state))
    assert optimizer_state_sha256(back) == optimizer_state_sha256(state)


@pytest.mark.parametrize("forge", [
    lambda p: p.update(shapes=[[10**6]] + p["shapes"][1:]),  # an entry past its buffer
    lambda p: p.update(keys=p["keys"][:-1], shapes=p["shapes"][:-1], dtypes=p["dtypes"][:-1]),
    lambda p: p.update(dtypes=["float64"] + p["dtypes"][1:]),  # a buffer it does not have
    lambda p: p.update(shapes=[[-1]] + p["shapes"][1:]),
    lambda p: p.update(keys=[p["keys"][1]] + p["keys"][1:]),  # one name twice
    lambda p: p["flat"].update(float32=p["flat"]["float32"].reshape(1, -1)),
    lambda p: p.update(scalars={"x": "not a number"}),
    lambda p: p.pop("flat"),
])
def test_a_forged_index_is_refused(forge):
    params, _ = adam_state()
    packed = pack(params)
    forge(packed)
    with pytest.raises(PackError):
        unpack(packed)


def test_an_optimizer_key_that_names_no_parameter_is_refused():
    with pytest.raises(PackError):
        unpack_optimizer_state(pack({"x/exp_avg": torch.zeros(2)}))
