"""The exchange buffer folds plain `loss.backward()` gradients exactly as a
weighted loss would, keeps a buffer per dtype, and carries the step scalars."""

from __future__ import annotations

import torch

from shoal.train.sync.exchange import GradientExchange
from shoal.train.fingerprint import fingerprint


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(dtype)


def test_folding_micro_batches_equals_the_mean_over_the_global_batch():
    model = _model()
    x, y = torch.randn(12, 4), torch.randn(12, 1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    exchange = GradientExchange(list(model.parameters()), groups=1)
    for chunk_x, chunk_y in zip(x.split(5), y.split(5)):  # uneven micro-batches: 5, 5, 2
        torch.nn.functional.mse_loss(model(chunk_x), chunk_y).backward()  # a plain backward
        exchange.fold(len(chunk_x) / 12)
        assert all(p.grad is None for p in model.parameters())
    exchange.install()
    for p, want in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, want)


def test_a_bf16_model_exchanges_bf16_and_the_scalars_ride_in_float32():
    model = _model(torch.bfloat16)
    exchange = GradientExchange(list(model.parameters()), groups=1)
    assert {t.dtype for t in exchange.tensors()} == {torch.bfloat16, torch.float32}
    model(torch.randn(3, 4, dtype=torch.bfloat16)).sum().backward()
    exchange.fold(1.0)
    exchange.install()
    assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())
    exchange.write_scalars(0, [0.1], True, 2.5, 5, (123, 456))
    scalars = exchange.read_scalars()
    assert scalars.lrs == (0.1,) or abs(scalars.lrs[0] - 0.1) < 1e-6
    assert scalars.mean_loss == 0.5 and scalars.fingerprints == (123 << 24 | 456,)


def test_summed_fingerprint_slots_show_every_rank():
    model = _model()
    world = 3
    tails = []
    for rank in range(world):
        exchange = GradientExchange(list(model.parameters()), groups=1)
        exchange.fresh(world)
        exchange.write_scalars(rank, [0.1], True, 1.0, 4, (rank + 1, 7))
        tails.append(exchange.buffers[torch.float32].clone())
    exchange.buffers[torch.float32].copy_(sum(tails))  # what the all-reduce does
    assert exchange.read_scalars().fingerprints == tuple((r + 1) << 24 | 7 for r in range(world))
    assert exchange.read_scalars().mean_loss == 3.0 / 12  # loss sums over sample counts


def test_no_reported_loss_means_no_loss_not_zero():
    model = _model()
    exchange = GradientExchange(list(model.parameters()), groups=1)
    exchange.write_scalars(0, [0.1], True, 0.0, 0, (0, 0))
    assert exchange.read_scalars().mean_loss is None


def test_fingerprint_sees_a_small_change():
    model = _model()
    before = fingerprint(list(model.parameters()))
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    assert fingerprint(list(model.parameters())) != before
    assert all(0 <= half < 1 << 24 for half in before)
