"""Writes the example clusters of `shoal plan` (64 devices each), after DT-FM's scenarios.

Like DT-FM's, most devices are 16 GB V100s, which cannot hold GPT-3 XL's
weights and Adam state alone, so every layout pipelines the model.

    .venv/bin/python examples/clusters/generate.py

Deterministic (seeded). Figures: NVLink-class links inside a machine, 100
Gbit/s fabric inside a data center (25 on spot instances), campus and
cross-country links of a few Gbit/s, and intercontinental links of 0.1-1
Gbit/s with round-trip-like latencies from the cities' distances. Each link
gets +-10 % of jitter so that no two are quite alike. `world_wide(n)` is
also used by bench/plan.py to scale the world-wide case up.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SEED = 2022
# kind: (peak bf16/fp16 dense TFLOP/s, memory GB)
KINDS = {"a100-80g": (312.0, 80.0), "a100-40g": (312.0, 40.0), "v100-32g": (125.0, 32.0),
         "v100-16g": (125.0, 16.0), "a10g": (70.0, 24.0), "t4": (65.0, 16.0),
         "rtx3090": (71.0, 24.0)}
# (latitude, longitude) of the regions the examples use
CITIES = {"oregon": (45.8, -119.7), "virginia": (38.9, -77.5), "ohio": (40.0, -83.0),
          "california": (37.4, -122.0), "tokyo": (35.7, 139.7), "seoul": (37.6, 127.0),
          "london": (51.5, -0.1), "frankfurt": (50.1, 8.7), "ireland": (53.3, -6.3),
          "campus-a": (42.4, -71.1), "campus-b": (37.4, -122.2)}


def _km(a: str, b: str) -> float:
    (la1, lo1), (la2, lo2) = (np.radians(CITIES[a]), np.radians(CITIES[b]))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6371 * math.asin(math.sqrt(h))


def wan_link(a: str, b: str) -> tuple[float, float]:
    """(latency ms, Gbit/s) between two regions: fibre at ~2/3 c over a 1.5x detour;
    bandwidth falls from ~5 Gbit/s next door to ~0.1 across the world."""
    km = _km(a, b)
    latency = 5.0 + km * 1.5 / 100.0  # round trip at 200 km per ms in fibre
    gbps = float(np.clip(5.0 * (1000.0 / max(km, 1000.0)) ** 1.1, 0.1, 5.0))
    return latency, gbps


def build(devices: list[dict], intra_node: tuple[float, float], intra_region: tuple[float, float],
          rng: np.random.Generator) -> dict:
    """Cluster JSON from devices (name, kind, region, node) and (ms, Gbit/s) inside a machine
    and inside a region; regions apart are joined by `wan_link`."""
    n = len(devices)
    regions = sorted({d["region"] for d in devices})
    wan = np.array([[wan_link(a, b) if a != b else intra_region for b in regions] for a in regions])
    region = np.array([regions.index(d["region"]) for d in devices])
    node = np.array([d["node"] for d in devices])
    figures = wan[region[:, None], region[None, :]]  # (n, n, 2)
    figures[node[:, None] == node[None, :]] = intra_node
    jitter = rng.uniform(0.9, 1.1, size=(n, n, 2))
    jitter = np.triu(jitter.transpose(2, 0, 1), 1)
    jitter = (jitter + jitter.transpose(0, 2, 1)).transpose(1, 2, 0)  # symmetric links
    figures = np.round(figures * jitter, 3)  # zero on the diagonal
    return {
        "devices": [{"name": d["name"], "tflops": KINDS[d["kind"]][0],
                     "memory_gb": KINDS[d["kind"]][1], "region": d["region"]} for d in devices],
        "latency_ms": figures[..., 0].tolist(), "bandwidth_gbps": figures[..., 1].tolist(),
    }


def _fleet(spec: list[tuple[str, str, int]], per_node: int = 8) -> list[dict]:
    """Devices from (region, kind, count), numbered in machines of `per_node`."""
    devices = []
    for region, kind, count in spec:
        for k in range(count):
            node = f"{region}-{kind}-{k // per_node}"
            devices.append({"name": f"{region}-{kind}-{k}", "kind": kind, "region": region,
                            "node": node})
    return devices


def datacenter(rng):
    # DT-FM's on-demand case: 8 machines of 8 V100s (NVLink inside, 100 Gbit/s between).
    return build(_fleet([("virginia", "v100-16g", 64)]), (0.01, 1200.0), (0.05, 100.0), rng)


def spot(rng):
    # Spot instances of four kinds in one region, machines of 4 on a 25 Gbit/s fabric.
    fleet = _fleet([("virginia", "v100-16g", 24), ("virginia", "a10g", 16),
                    ("virginia", "t4", 16), ("virginia", "a100-40g", 8)], per_node=4)
    return build(fleet, (0.02, 100.0), (0.3, 25.0), rng)


def two_universities(rng):
    fleet = _fleet([("campus-a", "rtx3090", 32), ("campus-b", "v100-16g", 32)], per_node=4)
    return build(fleet, (0.02, 100.0), (0.2, 10.0), rng)


def four_regions(rng):
    fleet = _fleet([(r, "v100-16g", 16) for r in ("oregon", "virginia", "ohio", "california")])
    return build(fleet, (0.01, 300.0), (0.1, 100.0), rng)


WORLD = ("oregon", "virginia", "ohio", "tokyo", "seoul", "london", "frankfurt", "ireland")


def world_wide(rng, per_region: int = 8):
    fleet = _fleet([(r, "v100-16g", per_region) for r in WORLD])
    return build(fleet, (0.01, 300.0), (0.1, 100.0), rng)


EXAMPLES = {"datacenter": datacenter, "spot": spot, "two-universities": two_universities,
            "four-regions": four_regions, "world-wide": world_wide}


def main() -> None:
    for name, make in EXAMPLES.items():
        cluster = make(np.random.default_rng(SEED))
        rows = ",\n  ".join(json.dumps(row) for row in cluster["latency_ms"])
        bw = ",\n  ".join(json.dumps(row) for row in cluster["bandwidth_gbps"])
        devices = ",\n  ".join(json.dumps(d) for d in cluster["devices"])
        text = (f'{{"devices": [\n  {devices}],\n"latency_ms": [\n  {rows}],\n'
                f'"bandwidth_gbps": [\n  {bw}]}}\n')
        (HERE / f"{name}.json").write_text(text)
        print(f"{name}: {len(cluster['devices'])} devices")


if __name__ == "__main__":
    main()
