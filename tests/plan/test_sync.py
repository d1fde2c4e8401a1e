"""Mode, codec and staleness: the most faithful option whose exchange fits the budget,
escalating as bandwidth falls; slt where a round's exchange can hide behind later rounds."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.plan import SyncConfig, SyncOption, ladder
from shoal.plan.sync import (
    DILOCO_BYTES, IN_FLIGHT_BYTES, RESIDUAL_BYTES, START_BYTES, choose, exchange_s, exposed_s,
    memory_classes, state_bytes,
)
from shoal.spec.job import SyncSpec
from shoal.spec.plan import Codec, SyncMode
from tests.plan.factory import toy_model

CONFIG = SyncConfig()  # budget: exchange <= 0.2 x pipeline time; slt 1 and 2 on offer
NO_SLT = SyncConfig(staleness=())
SHORT = SyncConfig(inner_steps=(10, 20))  # rounds no longer than 20 steps, slt 1 and 2


def _choice(bandwidth: float, width: int = 16, dp: int = 2, latency_s: float = 0.0,
            held: tuple[float, ...] = (), config: SyncConfig = CONFIG):
    """One stage group of 1e9 gradient bytes, 1 s of pipeline under every memory class
    (inf under the classes listed in `held`: those do not fit)."""
    extra, _ = memory_classes(ladder(config))
    pipeline = np.where(np.isin(extra, held), np.inf, 1.0)[:, None]
    index, per_step = choose(np.full((len(extra), 1, 1), 1e9), np.array([[bandwidth]]),
                             np.array([[latency_s]]), dp, pipeline, toy_model(width=width),
                             config)
    option = ladder(config)[int(index[0])]
    return option.mode, option.inner_steps, option.codec, option.slt, float(per_step[0])


def test_fast_network_plain_allreduce():
    assert _choice(1e11)[:4] == (SyncMode.allreduce, 1, Codec.none, 0)  # 0.01 s of 1 s


def test_moderate_network_int8():
    mode, _, codec, slt, per_step = _choice(4e9)  # 0.25 s plain, 0.125 s in int8
    assert (mode, codec, slt) == (SyncMode.allreduce, Codec.int8, 0)
    assert per_step == pytest.approx(0.125)


def test_slow_network_goes_local():
    # 10 s plain. DiLoCo with 50 inner steps is the first to fit 0.2 s (width 16 gives
    # PowerSGD no more than int8's factor), staleness on offer or not: a longer round
    # comes before a stale one. With rounds of at most 20 steps, SparseLoCo at 10 (a byte
    # per 64 values of 2 bytes and a 4-byte scale per 4,096: 1e9 x (1/64 + 1/1024) / 2
    # bytes to the one peer, 0.083 s over 10 steps) comes before staleness; where its
    # residual does not fit, 10 inner steps at slt 1 do: the round's 10 s of exchange runs
    # beside the next round's 10 x 1 s of compute.
    for config in (NO_SLT, CONFIG):
        assert _choice(1e8, config=config) == (SyncMode.diloco, 50, Codec.none, 0,
                                               pytest.approx(0.2))
    assert _choice(1e8, config=SHORT) == (SyncMode.diloco, 10, Codec.sparseloco, 0,
                                          pytest.approx(1e9 * (1 / 64 + 1 / 1024) / 2 / 1e8 / 10))
    assert _choice(1e8, held=(DILOCO_BYTES + RESIDUAL_BYTES,), config=SHORT) == (
        SyncMode.diloco, 10, Codec.none, 1, pytest.approx(0.0))


def test_wide_model_prefers_powersgd_to_local_steps():
    mode, _, codec, _, _ = _choice(1e8, width=1000)  # rank 4 of 1000: 0.008 of the bytes
    assert (mode, codec) == (SyncMode.allreduce, Codec.powersgd)


def test_hopeless_network_takes_the_cheapest():
    mode, inner, codec, _, _ = _choice(1e3)
    assert mode is SyncMode.diloco and inner == max(CONFIG.inner_steps)
    assert codec is Codec.sparseloco  # 0.83% of the bytes: top-k 1% sends 2%


def test_topk_all_gathers_so_it_grows_with_replicas():
    small = exchange_s(Codec.topk, np.array(1e9), np.array(1e9), np.array(0.0), 2, 0.03)
    large = exchange_s(Codec.topk, np.array(1e9), np.array(1e9), np.array(0.0), 64, 0.03)
    ring = exchange_s(Codec.none, np.array(1e9), np.array(1e9), np.array(0.0), 64, 0.03)
    assert large > 30 * small and ring < large


def test_int8_all_gathers_so_it_saves_bytes_only_between_few_replicas():
    # 1e9 B at 1e9 B/s: the plain ring sends 2 (dp-1)/dp of it, int8 (half the bytes)
    # dp-1 halves: 1.0 s against 0.5 s between two, 1.75 s against 3.5 s among eight.
    one = (np.array(1e9), np.array(1e9), np.array(0.0))
    assert exchange_s(Codec.none, *one, 2, 1.0) == pytest.approx(1.0)
    assert exchange_s(Codec.int8, *one, 2, 0.5) == pytest.approx(0.5)
    assert exchange_s(Codec.none, *one, 8, 1.0) == pytest.approx(1.75)
    assert exchange_s(Codec.int8, *one, 8, 0.5) == pytest.approx(3.5)


def test_options_that_memory_cannot_hold_are_skipped():
    # 8 s plain: without staleness DiLoCo 20 with int8 is the first to fit 0.2 s (8 / 2 / 20).
    assert _choice(1.25e8, config=NO_SLT)[:3] == (SyncMode.diloco, 20, Codec.int8)
    # Stages that cannot hold DiLoCo's outer copy (8 B/param) with int8's residual (4 more):
    # on to DiLoCo 50 plain (0.16 s).
    assert _choice(1.25e8, held=(DILOCO_BYTES + RESIDUAL_BYTES,), config=NO_SLT)[:3] == (
        SyncMode.diloco, 50, Codec.none)
    # Nor DiLoCo at all: nothing fits the budget, so the fastest held, every-step int8 (4 s).
    mode, _, codec, _, per_step = _choice(
        1.25e8, held=(DILOCO_BYTES, DILOCO_BYTES + RESIDUAL_BYTES), config=NO_SLT)
    assert (mode, codec, per_step) == (SyncMode.allreduce, Codec.int8, pytest.approx(4.0))
    # Staleness comes after every round length: on offer, the choice is the same.
    assert _choice(1.25e8)[:3] == (SyncMode.diloco, 20, Codec.int8)
    # With rounds of 10 steps at most, SparseLoCo at 10 fits; where a codec's residual does
    # not (12 B/param), DiLoCo 10 at slt 1 hides the 8 s; where its round in flight does
    # not fit either (20 B/param), slt 2 does too but holds two (28); none of them: nothing
    # fits the budget, so the fastest held, DiLoCo 10 uncompressed (8 s / 10).
    ten = SyncConfig(inner_steps=(10,))
    residual = DILOCO_BYTES + RESIDUAL_BYTES
    slt1, slt2 = (DILOCO_BYTES + START_BYTES + IN_FLIGHT_BYTES * k for k in (1, 2))
    assert _choice(1.25e8, config=ten)[:4] == (SyncMode.diloco, 10, Codec.sparseloco, 0)
    assert _choice(1.25e8, held=(residual,), config=ten)[:4] == (SyncMode.diloco, 10, Codec.none, 1)
    assert _choice(1.25e8, held=(residual, slt1), config=ten)[:4] == (
        SyncMode.diloco, 10, Codec.none, 2)
    assert _choice(1.25e8, held=(residual, slt1, slt2), config=ten) == (
        SyncMode.diloco, 10, Codec.none, 0, pytest.approx(0.8))


def test_staleness_hides_latency_k_rounds_deep():
    # One slow member: a 10 s latency on its link, so a ring of two costs 2 x 10 s (the
    # bytes take 0.001 s). Per step of 1 s, H inner steps and slt = k wait for
    # max(0, 20.001 / k - H) / H:
    diloco = SyncOption(SyncMode.diloco, 10, Codec.none)
    on_link, total, pipeline = np.array(0.001), np.array(20.001), np.array(1.0)
    assert exposed_s(diloco, on_link, total, pipeline) == pytest.approx(2.0001)  # 20.001 / 10
    assert exposed_s(SyncOption(SyncMode.diloco, 10, Codec.none, 1), on_link, total,
                     pipeline) == pytest.approx((20.001 - 10) / 10)
    assert exposed_s(SyncOption(SyncMode.diloco, 10, Codec.none, 2), on_link, total,
                     pipeline) == pytest.approx((10.0005 - 10) / 10)
    assert exposed_s(SyncOption(SyncMode.diloco, 20, Codec.none, 2), on_link, total,
                     pipeline) == 0.0
    # Without staleness the ladder needs H = 100 and int8, whose all-gather waits one
    # latency, not the ring's two (10.0005 / 100 s; uncompressed, H = 100 waits 0.20001),
    # and it goes there first with staleness on offer too. With rounds of at most 20
    # steps it takes H = 10 at slt = 2 (5e-5 s a step).
    for config in (NO_SLT, CONFIG):
        assert _choice(1e12, latency_s=10.0, config=config) == (
            SyncMode.diloco, 100, Codec.int8, 0, pytest.approx(0.100005))
    assert _choice(1e12, latency_s=10.0, config=SHORT) == (SyncMode.diloco, 10, Codec.none, 2,
                                                           pytest.approx(5e-5))


def test_staleness_hides_no_more_than_a_round_of_bandwidth():
    # 30 s of bytes on the link, no latency: rounds in flight share the link, so slt = 2
    # waits as long as slt = 1: a round lasts max(H x 1 s, 30 s).
    on_link = total = np.array(30.0)
    for k in (1, 2):
        assert exposed_s(SyncOption(SyncMode.diloco, 10, Codec.none, k), on_link, total,
                         np.array(1.0)) == pytest.approx(2.0)
    assert exposed_s(SyncOption(SyncMode.diloco, 50, Codec.none, 1), on_link, total,
                     np.array(1.0)) == 0.0


def test_the_ladder_never_offers_what_the_runtime_refuses():
    # Each option as a job file's [sync]: the runtime's own check accepts every one.
    offered = ladder(SyncConfig(staleness=(1, 2, 4)))
    assert {o.slt for o in offered} == {0, 1, 2, 4}
    for option in offered:
        SyncSpec(mode=option.mode, inner_steps=option.inner_steps, codec=option.codec,
                 slt=option.slt)
        if option.slt:
            assert option.codec is Codec.none  # offered uncompressed only
    with pytest.raises(ValueError, match="other than powersgd"):
        SyncOption(SyncMode.diloco, 10, Codec.powersgd, 1)
    with pytest.raises(ValueError, match="mode diloco"):
        SyncOption(SyncMode.allreduce, 1, Codec.none, 1)
    with pytest.raises(ValueError, match="staleness"):
        SyncConfig(staleness=(0,))
    assert state_bytes(SyncOption(SyncMode.diloco, 10, Codec.none, 2)) == 8 + 4 + 2 * 8
