"""Mode and codec: the most faithful option whose exchange fits the budget, escalating as
bandwidth falls."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.plan import SyncConfig, ladder
from shoal.plan.sync import DILOCO_BYTES, RESIDUAL_BYTES, choose, exchange_s, memory_classes
from shoal.spec.plan import Codec, SyncMode
from tests.plan.factory import toy_model

CONFIG = SyncConfig()  # budget: exchange <= 0.2 x pipeline time


def _choice(bandwidth: float, width: int = 16, dp: int = 2, held: tuple[float, ...] = ()):
    """One stage group of 1e9 gradient bytes, 1 s of pipeline under every memory class
    (inf under the classes listed in `held`: those do not fit)."""
    extra, _ = memory_classes(ladder(CONFIG))
    pipeline = np.where(np.isin(extra, held), np.inf, 1.0)[:, None]
    index, per_step = choose(np.full((len(extra), 1, 1), 1e9), np.array([[bandwidth]]),
                             np.array([[0.0]]), dp, pipeline, toy_model(width=width), CONFIG)
    option = ladder(CONFIG)[int(index[0])]
    return option.mode, option.inner_steps, option.codec, float(per_step[0])


def test_fast_network_plain_allreduce():
    assert _choice(1e11)[:3] == (SyncMode.allreduce, 1, Codec.none)  # 0.01 s of 1 s


def test_moderate_network_int8():
    mode, _, codec, per_step = _choice(4e9)  # 0.25 s plain, 0.125 s in int8
    assert (mode, codec) == (SyncMode.allreduce, Codec.int8)
    assert per_step == pytest.approx(0.125)


def test_slow_network_goes_local():
    # 10 s plain: DiLoCo with 50 inner steps is the first to fit 0.2 s (width 16 gives
    # PowerSGD no more than int8's factor).
    mode, inner, codec, per_step = _choice(1e8)
    assert (mode, inner, codec) == (SyncMode.diloco, 50, Codec.none)
    assert per_step == pytest.approx(0.2)


def test_wide_model_prefers_powersgd_to_local_steps():
    mode, _, codec, _ = _choice(1e8, width=1000)  # rank 4 of 1000: 0.008 of the bytes
    assert (mode, codec) == (SyncMode.allreduce, Codec.powersgd)


def test_hopeless_network_takes_the_cheapest():
    mode, inner, codec, _ = _choice(1e3)
    assert mode is SyncMode.diloco and inner == max(CONFIG.inner_steps)
    assert codec in (Codec.topk, Codec.powersgd)


def test_topk_all_gathers_so_it_grows_with_replicas():
    small = exchange_s(Codec.topk, np.array(1e9), np.array(1e9), np.array(0.0), 2, 0.03)
    large = exchange_s(Codec.topk, np.array(1e9), np.array(1e9), np.array(0.0), 64, 0.03)
    ring = exchange_s(Codec.none, np.array(1e9), np.array(1e9), np.array(0.0), 64, 0.03)
    assert large > 30 * small and ring < large


def test_options_that_memory_cannot_hold_are_skipped():
    # 8 s plain: DiLoCo 20 with int8 is the first to fit 0.2 s (8 / 2 / 20).
    assert _choice(1.25e8)[:3] == (SyncMode.diloco, 20, Codec.int8)
    # Stages that cannot hold DiLoCo's outer copy (8 B/param) with int8's residual (4 more):
    # on to DiLoCo 50 plain (0.16 s).
    assert _choice(1.25e8, held=(DILOCO_BYTES + RESIDUAL_BYTES,))[:3] == (
        SyncMode.diloco, 50, Codec.none)
    # Nor DiLoCo at all: nothing fits the budget, so the fastest held, every-step int8 (4 s).
    mode, _, codec, per_step = _choice(1.25e8, held=(DILOCO_BYTES, DILOCO_BYTES + RESIDUAL_BYTES))
    assert (mode, codec, per_step) == (SyncMode.allreduce, Codec.int8, pytest.approx(4.0))
