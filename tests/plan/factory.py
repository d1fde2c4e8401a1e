"""Small clusters and models for the planner's tests, with figures easy to compute by hand."""

from __future__ import annotations

import numpy as np

from shoal.spec.plan import Cluster, Device, ModelProfile

KINDS = ((312.0, 80.0), (125.0, 16.0), (125.0, 32.0), (70.0, 24.0), (65.0, 16.0))


def two_devices(latency_ms: float = 10.0, gbps: float = 8.0) -> Cluster:
    """a: 10 TFLOP/s, b: 5 TFLOP/s, 1 GB each, one link (8 Gbit/s = 1e9 bytes/s)."""
    return Cluster(
        devices=(Device(name="a", tflops=10.0, memory_gb=1.0),
                 Device(name="b", tflops=5.0, memory_gb=1.0)),
        latency_ms=((0.0, latency_ms), (latency_ms, 0.0)),
        bandwidth_gbps=((0.0, gbps), (gbps, 0.0)),
    )


def toy_model(**overrides) -> ModelProfile:
    """2 layers of 500 parameters; 1e12 FLOPs a layer and 1000 bytes a boundary per sample."""
    values = dict(name="toy", layers=2, width=100, parameters=1000,
                  activation_bytes_per_sample=1000.0, flops_per_sample=2e12, batch_samples=4)
    return ModelProfile(**(values | overrides))


def random_cluster(rng: np.random.Generator, low: int = 3, high: int = 8) -> Cluster:
    """low..high devices of random kinds in 1-3 regions; links drawn per pair of regions."""
    n, regions = int(rng.integers(low, high + 1)), int(rng.integers(1, 4))
    region = rng.integers(regions, size=n)
    devices = tuple(Device(name=f"d{i}", tflops=KINDS[k][0], memory_gb=KINDS[k][1],
                           region=f"r{region[i]}")
                    for i, k in enumerate(rng.integers(len(KINDS), size=n)))
    lat_r, bw_r = rng.uniform(20, 250, (regions, regions)), rng.uniform(0.1, 5, (regions, regions))
    latency, gbps = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            a, b = sorted((region[i], region[j]))
            same = a == b
            latency[i, j] = latency[j, i] = rng.uniform(0.05, 1) if same else lat_r[a, b]
            gbps[i, j] = gbps[j, i] = rng.uniform(25, 100) if same else bw_r[a, b]
    return Cluster(devices=devices, latency_ms=tuple(map(tuple, latency)),
                   bandwidth_gbps=tuple(map(tuple, gbps)))


def regions_cluster(per_region: int, regions: int, tflops: float = 125.0,
                    memory_gb: float = 16.0) -> Cluster:
    """Equal devices in equal regions, links from the cluster's region defaults."""
    return Cluster(devices=tuple(
        Device(name=f"r{r}-{i}", tflops=tflops, memory_gb=memory_gb, region=f"r{r}")
        for r in range(regions) for i in range(per_region)))
