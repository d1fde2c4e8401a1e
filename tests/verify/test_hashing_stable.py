"""Commitments, state hashes and sketch seeds are anchored on chain and compared
across versions of shoal (a verifier may run a newer one than the worker did): the
same values must hash to the same hex forever. The vectors below were computed by
the code that first anchored them."""

from __future__ import annotations

import torch

from shoal.train.hashing import optimizer_state_sha256, param_sha256
from shoal.verify.proof_store import contribution_sha256
from shoal.verify.sketch import sum_seed


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(3, 5, generator=g), torch.randn(11, generator=g).to(torch.float16),
            torch.empty(0)]


def test_a_contribution_commitment_and_a_sum_seed_are_what_they_always_were():
    assert contribution_sha256("job", "w0", 12, _tensors()) == \
        "858212f7c2a80568a9fe3293f9c46b84847ce28f131889a941748cb4ccc6bf69"
    assert sum_seed(_tensors()) == "d4c6f1c62cde646ca7b401d0bc48221b772aa095d2409393bb61427074cfea7d"


def test_parameter_and_optimizer_state_hashes_are_what_they_always_were():
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.copy_(torch.arange(12.0).reshape(3, 4))
        model.bias.copy_(torch.tensor([1.0, 2.0, 3.0]))
    assert param_sha256(model) == "6a54e6e6984fc8499d1c83d48304999692a4b1ecbb14165f0467a119f19209a9"
    state = {0: {"step": torch.tensor(3.0), "exp_avg": torch.arange(6.0).reshape(2, 3),
                 "exp_avg_sq": torch.ones(2, 3)},
             1: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(4),
                 "exp_avg_sq": torch.full((4,), 2.0)}}
    assert optimizer_state_sha256(state) == \
        "c0216d2ef60457b59a99ee0b45eac336faa7e619eadc16e5e93f12f809cf03b2"
