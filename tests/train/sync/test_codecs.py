"""Codecs with error feedback: what is not sent is delayed, never lost; residuals
are staged until a step commits and dropped at membership changes; every
replica decodes the same bits (real gloo ranks in threads)."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from shoal.spec.job import SyncSpec
from shoal.train.sync.codecs import Int8Codec, PowerSGDCodec, SparseLoCoCodec, TopKCodec, make_codec
from shoal.train.sync.codecs.int8 import dequantize, quantize
from shoal.train.sync.codecs.powersgd import orthonormalize
from shoal.train.sync.codecs.sparseloco import decode, encode
from tests.train.sync.test_aggregate import _groups, _let_die

SHAPES = [torch.Size([24, 16]), torch.Size([16]), torch.Size([8, 3, 4]), torch.Size([5])]
NUMEL = sum(s.numel() for s in SHAPES)


class Alone:
    """A group of one: collectives change nothing."""

    world = 1

    def all_reduce(self, tensors, should_cancel):
        pass

    def all_gather(self, tensors, should_cancel):
        return [[t.clone()] for t in tensors]


def _codecs():
    return [Int8Codec(SHAPES), TopKCodec(SHAPES, 0.05), PowerSGDCodec(SHAPES, 2),
            SparseLoCoCodec(SHAPES)]


@pytest.mark.parametrize("codec", _codecs(), ids=lambda c: c.name)
def test_nothing_is_lost_only_delayed(codec):
    """Sum of what was sent plus the residual equals the sum of the contributions."""
    generator = torch.Generator().manual_seed(1)
    sent, given = torch.zeros(NUMEL), torch.zeros(NUMEL)
    for _ in range(40):
        g = torch.randn(NUMEL, generator=generator)
        given += g
        sent += codec.exchange(g, Alone(), lambda: False)
        codec.commit()
    assert torch.allclose(sent + codec.residual, given, atol=1e-4)


@pytest.mark.parametrize("codec", _codecs(), ids=lambda c: c.name)
def test_unbiased_over_steps(codec):
    """A constant gradient: the mean of what is sent converges to it (the residual
    stays bounded), where compression alone would keep a fixed bias."""
    g = torch.randn(NUMEL, generator=torch.Generator().manual_seed(2))
    one_shot = codec.exchange(g, Alone(), lambda: False)
    codec.discard()
    bias_once = float((one_shot - g).norm())
    # SparseLoCo sends 1 value in 64 a step: its residual settles at tens of steps' worth.
    total, steps = torch.zeros(NUMEL), 2000 if codec.name == "sparseloco" else 400
    for _ in range(steps):
        total += codec.exchange(g, Alone(), lambda: False)
        codec.commit()
    bias_mean = float((total / steps - g).norm())
    assert bias_mean < 0.05 * max(bias_once, 1e-3) + 1e-4, (bias_once, bias_mean)


def test_residual_staged_until_commit_and_dropped_on_reset(caplog):
    codec = TopKCodec(SHAPES, 0.05)
    g = torch.randn(NUMEL, generator=torch.Generator().manual_seed(3))
    codec.exchange(g, Alone(), lambda: False)
    assert codec.residual is None  # not committed yet
    codec.discard()
    assert codec.residual is None
    codec.exchange(g, Alone(), lambda: False)
    codec.commit()
    kept = codec.residual.clone()
    assert kept.abs().sum() > 0
    codec.exchange(g, Alone(), lambda: False)
    codec.discard()  # a redone step starts from the same residual
    assert torch.equal(codec.residual, kept)
    with caplog.at_level(logging.INFO, logger="shoal.train.sync.codecs.base"):
        codec.reset("membership epoch 3 formed")
    assert codec.residual is None and "residual" in caplog.text and "epoch 3" in caplog.text


def test_int8_round_trip_within_half_a_step_per_chunk():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(4)) * 3
    q, scales = quantize(x)
    assert q.dtype == torch.int8 and scales.numel() == 5  # 1024 values per scale
    error = (dequantize(q, scales) - x).abs()
    step = scales.repeat_interleave(1024)[:5000]
    assert bool((error <= step / 2 + 1e-6).all())


def test_topk_sends_the_largest_entries():
    codec = TopKCodec([torch.Size([100])], 0.03)
    x = torch.arange(100, dtype=torch.float32) - 50.0  # largest magnitudes: -50, 49, -49
    sent = codec.exchange(x, Alone(), lambda: False)
    assert sorted(sent.nonzero().view(-1).tolist()) == [0, 1, 99]
    assert codec.bytes_sent == 0  # alone: nothing goes on the wire


def test_sparseloco_sends_each_blocks_largest_value_in_one_byte():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(7))
    x[130] = -40.0  # the largest of block 2, and of everything: it sets group 0's scale
    codes, scales = encode(x)
    assert codes.dtype == torch.uint8 and codes.numel() == 79  # ceil(5000 / 64) blocks
    assert scales.numel() == 2 and scales[0] == 20.0  # 64 blocks a scale: half the largest
    sent = decode(codes, scales, x.numel())
    blocks = torch.nn.functional.pad(x, (0, -5000 % 64)).view(-1, 64)
    kept = torch.nn.functional.pad(sent, (0, -5000 % 64)).view(-1, 64)
    assert bool(((kept != 0).sum(dim=1) == 1).all())
    largest = blocks.abs().argmax(dim=1)
    assert torch.equal(kept.abs().argmax(dim=1), largest)
    assert torch.equal(kept.gather(1, largest[:, None]).sign(),
                       blocks.gather(1, largest[:, None]).sign())
    assert sent[130] == -40.0
    assert set(sent[sent != 0].abs().unique().tolist()) <= {20.0, 40.0, float(scales[1]),
                                                            2 * float(scales[1])}
    # The wire: a byte a block and 4 a scale, times the 2 peers a member sends to.
    assert SparseLoCoCodec([x.shape]).message_bytes([codes, scales], world=3) == 2 * (79 + 8)


def test_powersgd_is_exact_for_low_rank_matrices_and_vectors():
    generator = torch.Generator().manual_seed(5)
    low = torch.randn(24, 2, generator=generator) @ torch.randn(2, 16, generator=generator)
    rest = torch.randn(NUMEL - low.numel(), generator=generator)
    x = torch.cat([low.reshape(-1), rest])
    codec = PowerSGDCodec(SHAPES, 2)
    sent = codec.exchange(x, Alone(), lambda: False)
    assert torch.allclose(sent[: low.numel()], low.reshape(-1), atol=1e-4)
    # [8, 3, 4] as 8 x 12 at rank 2 gains (2 x 20 < 96), so it is approximated; vectors are sent whole
    assert torch.equal(sent[low.numel():low.numel() + 16], rest[:16])


def test_orthonormalize_gives_orthonormal_columns():
    p = torch.randn(30, 4, generator=torch.Generator().manual_seed(6))
    orthonormalize(p)
    assert torch.allclose(p.T @ p, torch.eye(4), atol=1e-5)


def test_make_codec_names_match_the_planner():
    assert make_codec(SyncSpec(), SHAPES) is None
    for name, kind in (("int8", Int8Codec), ("topk", TopKCodec), ("powersgd", PowerSGDCodec),
                       ("sparseloco", SparseLoCoCodec)):
        assert isinstance(make_codec(SyncSpec(codec=name), SHAPES), kind)


@pytest.mark.parametrize("name", ["int8", "topk", "powersgd", "sparseloco"])
def test_every_rank_decodes_the_same_bits(name):
    world, out = 3, {}
    groups = _groups(world)
    inputs = [torch.randn(NUMEL, generator=torch.Generator().manual_seed(10 + r)) for r in range(world)]
    codecs = [make_codec(SyncSpec(codec=name, topk_fraction=0.05, powersgd_rank=2), SHAPES)
              for _ in range(world)]

    def run(rank: int) -> None:
        totals = []
        for _ in range(3):  # residuals and PowerSGD's warm start in play
            totals.append(codecs[rank].exchange(inputs[rank], groups[rank], lambda: False))
            codecs[rank].commit()
        out[rank] = totals

    _on_ranks(world, run, groups)
    for step in range(3):
        assert all(torch.equal(out[0][step], out[r][step]) for r in range(world))
    # Over the three steps, what all ranks sent plus what they kept is what they gave.
    sent = sum(out[0])
    kept = sum(c.residual for c in codecs)
    assert torch.allclose(sent + kept, 3 * sum(inputs), atol=1e-3)
    assert all(c.bytes_sent > 0 for c in codecs)


@pytest.mark.parametrize("name", ["int8", "topk", "sparseloco"])
def test_a_background_exchange_gives_the_bits_of_a_blocking_one(name):
    """`start`, an all-gather, then `finish` (how DiLoCo with slt sends a round) sums
    and stages exactly what `exchange` does."""
    world, results = 3, {}
    groups = _groups(world)

    def run(rank: int) -> None:
        contributions = [torch.randn(NUMEL, generator=torch.Generator().manual_seed(10 * rank + i))
                         for i in range(2)]
        blocking = make_codec(SyncSpec(codec=name, topk_fraction=0.1), SHAPES)
        background = make_codec(SyncSpec(codec=name, topk_fraction=0.1), SHAPES)
        out = []
        for g in contributions:  # two steps: the second carries the first's residual
            a = blocking.exchange(g, groups[rank], lambda: False)
            blocking.commit()
            b = background.finish(groups[rank].all_gather(background.start(g), lambda: False))
            background.commit()
            out.append((a, b, blocking.residual, background.residual))
        results[rank] = out

    _on_ranks(world, run, groups)
    assert len(results) == world
    for out in results.values():
        for a, b, ra, rb in out:
            assert torch.equal(a, b) and torch.equal(ra, rb)
    assert torch.equal(results[0][1][0], results[2][1][0])  # the same sum on every replica


def _on_ranks(world: int, run, groups) -> None:
    """`run(rank)` for every rank on its own thread; then the groups are let go."""
    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _let_die(groups)


@pytest.mark.parametrize("name", ["int8", "topk", "sparseloco"])
def test_scalars_ride_in_the_same_all_gather(name):
    """`exchange_with` (DiLoCo's outer step over a slow link: one collective, not two)
    gives the sum and residual `exchange` gives, the scalars summed in rank order, the
    same bits on every rank, in one all-gather."""
    world, results = 3, {}
    groups = _groups(world)
    gathers = []
    for group in groups:
        original = group.all_gather

        def counted(tensors, should_cancel, original=original):
            gathers.append(len(tensors))
            return original(tensors, should_cancel)

        group.all_gather = counted

    def run(rank: int) -> None:
        g = torch.randn(NUMEL, generator=torch.Generator().manual_seed(20 + rank))
        scalars = torch.tensor([0.1 * (rank + 1), float(rank + 5), -3.0])
        plain = make_codec(SyncSpec(codec=name, topk_fraction=0.1), SHAPES)
        riding = make_codec(SyncSpec(codec=name, topk_fraction=0.1), SHAPES)
        out = []
        for _ in range(2):  # the second step carries the first's residual
            a = plain.exchange(g, groups[rank], lambda: False)
            plain.commit()
            b, summed = riding.exchange_with(g, scalars, groups[rank], lambda: False)
            riding.commit()
            out.append((a, b, summed, plain.residual, riding.residual))
        results[rank] = (out, riding.bytes_sent - plain.bytes_sent)

    _on_ranks(world, run, groups)
    assert len(results) == world
    assert gathers.count(1) == 2 * world  # exchange_with: one tensor, one gather a step
    expected = torch.tensor([0.1, 5.0, -3.0]) + torch.tensor([0.2, 6.0, -3.0]) \
        + torch.tensor([0.30000001192092896, 7.0, -3.0])
    for out, extra_bytes in results.values():
        assert extra_bytes == 2 * 2 * 12  # the scalars' 12 bytes to 2 peers, twice
        for a, b, summed, ra, rb in out:
            assert torch.equal(a, b) and torch.equal(ra, rb)
            assert torch.equal(summed, expected)
    assert torch.equal(results[0][0][1][1], results[2][0][1][1])
