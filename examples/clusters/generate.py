"""Writes the example clusters of `shoal plan` (64 devices each), after DT-FM's scenarios.

Like DT-FM's, most devices are 16 GB V100s, which cannot hold GPT-3 XL's
weights and Adam state alone, so every layout pipelines the model.

    .venv/bin/python examples/clusters/generate.py

Deterministic (seeded). Figures: NVLink-class links inside a machine, 100
Gbit/s fabric inside a data center (25 on spot instances), campus and
cross-country links of a few Gbit/s, and intercontinental links of 0.1-1
Gbit/s with round-trip-like latencies from the cities' distances. The
world-wide case is DT-FM's own: one V100 per instance, 5 ms and 2 Gbit/s
inside a region, and the latency and bandwidth DT-FM measured between each
pair of its eight AWS regions (`MEASURED`). Each link gets +-10 % of jitter
so that no two are quite alike. `world_wide(n)` is also used by
bench/plan.py to scale the world-wide case up.
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
          "california": (37.4, -122.0), "campus-a": (42.4, -71.1), "campus-b": (37.4, -122.2)}


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


# (latency ms, Gbit/s) between AWS regions as DT-FM measured them (Yuan et al. 2022; the
# table of its world-wide scenario, DS3Lab/DT-FM scheduler/generate_sim_com_matrices.py);
# DT-FM assumed 5 ms and 2 Gbit/s between two single-GPU instances of one region.
MEASURED = {
    ("oregon", "virginia"): (67, 0.79), ("oregon", "ohio"): (49, 1.10),
    ("oregon", "tokyo"): (96, 0.523), ("oregon", "seoul"): (124, 0.46),
    ("oregon", "london"): (136, 0.42), ("oregon", "frankfurt"): (143, 0.404),
    ("oregon", "ireland"): (124, 0.482), ("virginia", "ohio"): (11, 1.12),
    ("virginia", "tokyo"): (143, 0.524), ("virginia", "seoul"): (172, 0.500),
    ("virginia", "london"): (76, 1.16), ("virginia", "frankfurt"): (90, 1.02),
    ("virginia", "ireland"): (67, 1.05), ("ohio", "tokyo"): (130, 0.694),
    ("ohio", "seoul"): (159, 0.529), ("ohio", "london"): (86, 1.05),
    ("ohio", "frankfurt"): (99, 0.799), ("ohio", "ireland"): (77, 1.14),
    ("tokyo", "seoul"): (34, 1.10), ("tokyo", "london"): (210, 0.366),
    ("tokyo", "frankfurt"): (223, 0.36), ("tokyo", "ireland"): (199, 0.465),
    ("seoul", "london"): (238, 0.342), ("seoul", "frankfurt"): (235, 0.358),
    ("seoul", "ireland"): (228, 0.335), ("london", "frankfurt"): (14, 1.14),
    ("london", "ireland"): (12, 1.09), ("frankfurt", "ireland"): (24, 1.08),
}
DTFM_REGION = (5.0, 2.0)


def measured_link(a: str, b: str) -> tuple[float, float]:
    """(latency ms, Gbit/s) between two of DT-FM's regions, as measured."""
    return MEASURED.get((a, b)) or MEASURED[(b, a)]


def build(devices: list[dict], intra_node: tuple[float, float], intra_region: tuple[float, float],
          rng: np.random.Generator, wan_of=wan_link) -> dict:
    """Cluster JSON from devices (name, kind, region, node) and (ms, Gbit/s) inside a machine
    and inside a region; regions apart are joined by `wan_of(a, b)`."""
    n = len(devices)
    regions = sorted({d["region"] for d in devices})
    wan = np.array([[wan_of(a, b) if a != b else intra_region for b in regions] for a in regions])
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
    # DT-FM's world-wide scenario: single-V100 instances (p3.2xlarge), 8 in each of 8
    # regions, its measured links between regions and its 2 Gbit/s inside one.
    fleet = _fleet([(r, "v100-16g", per_region) for r in WORLD], per_node=1)
    return build(fleet, DTFM_REGION, DTFM_REGION, rng, wan_of=measured_link)


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
