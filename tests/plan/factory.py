"""Small clusters and models for the planner's tests, with figures easy to compute by hand."""

from __future__ import annotations

from shoal.plan.synthetic import random_cluster  # noqa: F401  (the tests' random clusters)
from shoal.spec.plan import Cluster, Device, ModelProfile


def two_devices(latency_ms: float = 10.0, gbps: float = 8.0, memory_gb: float = 1.0) -> Cluster:
    """a: 10 TFLOP/s, b: 5 TFLOP/s, 1 GB each, one link (8 Gbit/s = 1e9 bytes/s)."""
    return Cluster(
        devices=(Device(name="a", tflops=10.0, memory_gb=memory_gb),
                 Device(name="b", tflops=5.0, memory_gb=memory_gb)),
        latency_ms=((0.0, latency_ms), (latency_ms, 0.0)),
        bandwidth_gbps=((0.0, gbps), (gbps, 0.0)),
    )


def toy_model(**overrides) -> ModelProfile:
    """2 layers of 500 parameters; 1e12 FLOPs a layer and 1000 bytes a boundary per sample."""
    values = dict(name="toy", layers=2, width=100, parameters=1000,
                  activation_bytes_per_sample=1000.0, flops_per_sample=2e12, batch_samples=4)
    return ModelProfile(**(values | overrides))


def regions_cluster(per_region: int, regions: int, tflops: float = 125.0,
                    memory_gb: float = 16.0) -> Cluster:
    """Equal devices in equal regions, links from the cluster's region defaults."""
    return Cluster(devices=tuple(
        Device(name=f"r{r}-{i}", tflops=tflops, memory_gb=memory_gb, region=f"r{r}")
        for r in range(regions) for i in range(per_region)))
