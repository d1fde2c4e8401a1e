"""The cost model against cases computed by hand (see factory.two_devices and toy_model)."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.plan import CostConfig, evaluate, ladder, topology
from shoal.plan.cost import allocate_layers
from shoal.spec.plan import Codec, SyncMode
from tests.plan.factory import toy_model, two_devices

HALF = CostConfig(efficiency=0.5)  # a: 5e12 FLOP/s achieved, b: 2.5e12


def test_pipeline_of_two_stages():
    # a holds layer 0 (1e12 FLOPs a sample: 0.2 s), b layer 1 (0.4 s); 4 micro-batches;
    # the link: 10 ms + 1000 B / 1e9 B/s. (M-1) x slowest + fill/drain + link both ways.
    costs = evaluate(topology(two_devices()), toy_model(), np.array([[[0], [1]]]), HALF)
    link = 0.01 + 1000 / 1e9
    assert costs.pipeline_s[0] == pytest.approx(3 * 0.4 + (0.2 + 0.4) + 2 * link)
    assert costs.exchange_s[0] == 0.0  # one replica: nothing to exchange
    assert costs.step_s[0] == pytest.approx(costs.pipeline_s[0])
    assert costs.layers[0].tolist() == [1, 1]


def test_two_replicas_paced_by_the_slower():
    # One stage on both: 2 micro-batches each, at b's pace (2 layers, 0.8 s each); then a
    # ring all-reduce of 2 x 500 params x 2 B: 2 (dp-1)/dp x 2000 B / 1e9 + 2 (dp-1) x 10 ms.
    costs = evaluate(topology(two_devices()), toy_model(), np.array([[[0, 1]]]), HALF)
    assert costs.pipeline_s[0] == pytest.approx(2 * 0.8)
    assert costs.exchange_s[0] == pytest.approx(2000 / 1e9 + 0.02)
    assert costs.sync[0] == 0  # small enough: plain all-reduce


def test_a_slow_link_between_stages_paces_the_pipeline():
    # 0.1 Gbit/s and 500 ms: each micro-batch's transfer (0.5 s + 80 us) outlasts b's compute.
    costs = evaluate(topology(two_devices(latency_ms=500.0, gbps=0.1)), toy_model(),
                     np.array([[[0], [1]]]), HALF)
    link = 0.5 + 1000 / (0.1e9 / 8)
    assert costs.pipeline_s[0] == pytest.approx(3 * link + 0.6 + 2 * link)


def test_layers_follow_speed_within_memory():
    assert allocate_layers(np.array([[1.0, 3.0]]), np.array([[99, 99]]), 8).tolist() == [[2, 6]]
    # The fast stage can hold only 4 layers: the rest go to the slow one.
    assert allocate_layers(np.array([[1.0, 3.0]]), np.array([[99, 4]]), 8).tolist() == [[4, 4]]
    assert allocate_layers(np.array([[1.0, 3.0]]), np.array([[3, 4]]), 8).tolist() == [[-1, -1]]


def test_a_model_too_big_for_memory_costs_infinity():
    huge = toy_model(parameters=10**9)  # 16 GB of state on 1 GB devices
    costs = evaluate(topology(two_devices()), huge, np.array([[[0, 1]]]), HALF)
    assert np.isinf(costs.step_s[0])


def test_diloco_only_where_its_outer_copy_fits():
    # Two replicas of both layers, 1.6 s of pipeline (2 micro-batches at b's 0.8 s); a
    # 500 ms link makes every-step all-reduce 2000 B / 1e9 B/s + 2 x 0.5 s: over the
    # budget (0.2 x 1.6 s), so with room to spare DiLoCo with 10 inner steps is chosen.
    grid = np.array([[[0, 1]]])
    roomy = evaluate(topology(two_devices(latency_ms=500.0)), toy_model(), grid, HALF)
    option = ladder(HALF.sync)[int(roomy.sync[0])]
    assert (option.mode, option.inner_steps, option.codec) == (SyncMode.diloco, 10, Codec.none)
    assert roomy.exchange_s[0] == pytest.approx((2e-6 + 1.0) / 10)
    # 20 kB a device: a layer is 500 params x 16 B + one boundary of 1000 B = 9 kB, two fit;
    # DiLoCo adds 8 B/param (13 kB a layer) and int8's residual 4 (11 kB): neither fits,
    # so every-step all-reduce, uncompressed, over the budget, is all that is left.
    tight = evaluate(topology(two_devices(latency_ms=500.0, memory_gb=2e-5)), toy_model(), grid,
                     HALF)
    option = ladder(HALF.sync)[int(tight.sync[0])]
    assert (option.mode, option.codec) == (SyncMode.allreduce, Codec.none)
    assert tight.step_s[0] == pytest.approx(1.6 + 2e-6 + 1.0)
    assert tight.layers[0].tolist() == [2]
