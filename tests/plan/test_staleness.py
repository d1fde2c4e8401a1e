"""The planner chooses bounded staleness (slt) where one slow region's exchange would stall
the rest, and not where no region is slow; figures computed by hand."""

from __future__ import annotations

import pytest

from shoal.plan import CostConfig, SearchConfig, SyncConfig, plan
from shoal.spec.plan import Cluster, Codec, Device, ModelProfile, RegionLink, SyncMode

# 2 layers of 5e7 parameters (2e8 gradient bytes); 1e12 FLOPs a sample; 64 samples a step.
# Width 8 leaves PowerSGD nothing to gain.
MODEL = ModelProfile(name="dp", layers=2, width=8, parameters=10**8,
                     activation_bytes_per_sample=1000.0, flops_per_sample=1e12, batch_samples=64)
DATA_PARALLEL = SearchConfig(only_shapes=((8, 1),))


def _cluster(slow_region: bool) -> Cluster:
    """4 regions of 2 devices (10 TFLOP/s, 80 GB); 20 ms and 10 Gbit/s between regions, and
    if `slow_region`, 300 ms and 1 Gbit/s between r3 and the others."""
    slow = tuple(RegionLink(a="r3", b=f"r{r}", latency_ms=300.0, bandwidth_gbps=1.0)
                 for r in range(3)) if slow_region else ()
    return Cluster(devices=tuple(Device(name=f"r{r}-{i}", tflops=10.0, memory_gb=80.0,
                                        region=f"r{r}") for r in range(4) for i in range(2)),
                   inter_region_latency_ms=20.0, inter_region_bandwidth_gbps=10.0,
                   region_links=slow)


def test_no_slow_region_no_staleness():
    # 8 replicas, 8 micro-batches each at 2 layers x 5e11 / 4e12 FLOP/s: 2.0 s a step. Ring
    # exchange: 2 x 7/8 x 2e8 B / 1.25e9 B/s + 14 x 20 ms = 0.56 s, over 0.2 x 2.0; int8
    # 0.42 still over; DiLoCo with 10 inner steps waits 0.056 s a step: within budget.
    result = plan(_cluster(slow_region=False), MODEL, DATA_PARALLEL)
    assert (result.mode, result.inner_steps, result.codec, result.slt) == (
        SyncMode.diloco, 10, Codec.none, 0)
    assert result.step_time_s == pytest.approx(2.0 + 0.056)


def test_one_slow_region_gets_a_longer_round_before_staleness():
    # Through r3: 1.75 x 2e8 / 1.25e8 B/s + 14 x 300 ms = 2.8 + 4.2 = 7.0 s an exchange.
    # DiLoCo 10 would wait 0.7 s a step (int8 0.56), over 0.2 x 2.0; DiLoCo 20 waits
    # 7.0 / 20 = 0.35 s: within budget, and a longer round costs less than a stale one
    # (bench/wan.py), so the planner goes there first.
    slow = _cluster(slow_region=True)
    result = plan(slow, MODEL, DATA_PARALLEL)
    assert (result.mode, result.inner_steps, result.codec, result.slt) == (
        SyncMode.diloco, 20, Codec.none, 0)
    assert result.step_time_s == pytest.approx(2.0 + 0.35)
    # With rounds of 10 steps at most, SparseLoCo's bytes (2e8 x (1/64 + 1/1024) / 2 a
    # member) cross in 7 x 1.66e6 / 1.25e8 = 0.093 s, and with the latencies 2.19 s: 0.219 s
    # a step, within budget, so it comes before staleness.
    ten = SyncConfig(inner_steps=(10,))
    sparse = plan(slow, MODEL, SearchConfig(only_shapes=((8, 1),), cost=CostConfig(sync=ten)))
    assert (sparse.mode, sparse.inner_steps, sparse.codec, sparse.slt) == (
        SyncMode.diloco, 10, Codec.sparseloco, 0)
    assert sparse.step_time_s == pytest.approx(2.0 + (7 * 2e8 * (1 / 64 + 1 / 1024) / 2 / 1.25e8
                                                      + 14 * 0.3 / 2) / 10)
    # On a budget of 10% (0.2 s) only staleness hides the link: at slt = 1 the exchange
    # runs beside the next round's 10 x 2.0 s of compute and nobody waits.
    short = plan(slow, MODEL, SearchConfig(only_shapes=((8, 1),), cost=CostConfig(
        sync=SyncConfig(inner_steps=(10,), exchange_budget=0.1))))
    assert (short.mode, short.inner_steps, short.codec, short.slt) == (
        SyncMode.diloco, 10, Codec.none, 1)
    assert short.breakdown.exchange_s == 0.0
    assert short.step_time_s == pytest.approx(2.0)
