"""Random clusters for testing and benchmarking the search: a few devices of
common kinds in a few regions, with fast links inside a region and slow,
uneven ones between regions (drawn per pair of regions, as in DT-FM)."""

from __future__ import annotations

import numpy as np

from shoal.spec.plan import Cluster, Device

# (peak TFLOP/s, memory GB): A100-80G, V100-16G, V100-32G, A10G, T4.
KINDS = ((312.0, 80.0), (125.0, 16.0), (125.0, 32.0), (70.0, 24.0), (65.0, 16.0))


def random_cluster(rng: np.random.Generator, low: int = 3, high: int = 8,
                   max_regions: int = 3) -> Cluster:
    """low..high devices in 1..max_regions regions."""
    n, regions = int(rng.integers(low, high + 1)), int(rng.integers(1, max_regions + 1))
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
