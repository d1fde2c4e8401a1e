"""A cluster and a model as the planner computes with them: arrays in SI units.

Also reads cluster and model descriptions from text (JSON or TOML), so that
the CLI and the benchmarks share one parser with one kind of error.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from shoal.plan.errors import InvalidCluster, UnknownModel
from shoal.spec.errors import describe_validation_error
from shoal.spec.plan import MODEL_PRESETS, Cluster, ModelProfile

BITS = 8.0


@dataclass(frozen=True)
class Topology:
    """Devices and links in device order: FLOP/s, bytes, seconds, bytes/s."""

    names: tuple[str, ...]
    regions: tuple[str, ...]
    flops: np.ndarray  # (n,) peak FLOP/s
    memory_bytes: np.ndarray  # (n,)
    latency_s: np.ndarray  # (n, n); 0 on the diagonal
    bandwidth: np.ndarray  # (n, n) bytes/s; inf on the diagonal

    @property
    def size(self) -> int:
        return len(self.names)

    def message_s(self, message_bytes: float) -> np.ndarray:
        """(n, n) seconds to send one message of this size over each link."""
        return self.latency_s + message_bytes / self.bandwidth


def topology(cluster: Cluster) -> Topology:
    """The cluster's arrays, filling absent matrices from the region figures."""
    n = len(cluster.devices)
    if cluster.latency_ms is not None and cluster.bandwidth_gbps is not None:
        latency_ms = np.array(cluster.latency_ms, dtype=float)
        gbps = np.array(cluster.bandwidth_gbps, dtype=float)
    else:
        latency_ms, gbps = _region_matrices(cluster)
    idx = np.arange(n)
    latency_s = latency_ms / 1e3
    latency_s[idx, idx] = 0.0
    bandwidth = gbps * 1e9 / BITS
    bandwidth[idx, idx] = np.inf
    return Topology(
        names=tuple(d.name for d in cluster.devices),
        regions=tuple(d.region for d in cluster.devices),
        flops=np.array([d.tflops * 1e12 for d in cluster.devices]),
        memory_bytes=np.array([d.memory_gb * 1e9 for d in cluster.devices]),
        latency_s=latency_s,
        bandwidth=bandwidth,
    )


def _region_matrices(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    regions = sorted({d.region for d in cluster.devices})
    index = {r: i for i, r in enumerate(regions)}
    same = np.eye(len(regions), dtype=bool)
    latency = np.where(same, cluster.intra_region_latency_ms, cluster.inter_region_latency_ms)
    gbps = np.where(same, cluster.intra_region_bandwidth_gbps, cluster.inter_region_bandwidth_gbps)
    for link in cluster.region_links:
        if link.a in index and link.b in index:
            a, b = index[link.a], index[link.b]
            latency[a, b] = latency[b, a] = link.latency_ms
            gbps[a, b] = gbps[b, a] = link.bandwidth_gbps
    of = np.array([index[d.region] for d in cluster.devices])
    return latency[np.ix_(of, of)].astype(float), gbps[np.ix_(of, of)].astype(float)


def _load(text: str, source: str, error: type[Exception]) -> dict:
    try:
        values = json.loads(text) if source.endswith(".json") else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as bad:
        kind = "JSON" if source.endswith(".json") else "TOML"
        raise error(f"{source}: malformed {kind} ({bad}); fix the file's syntax") from None
    if not isinstance(values, dict):
        raise error(f"{source}: expected a table of keys at the top level, not {type(values).__name__}")
    return values


def parse_cluster(text: str, source: str) -> Cluster:
    """A cluster from JSON (if `source` ends in .json) or TOML text."""
    values = _load(text, source, InvalidCluster)
    try:
        return Cluster.model_validate(values)
    except ValidationError as error:
        raise InvalidCluster(describe_validation_error(error, Cluster, source)) from None


def model_preset(name: str) -> ModelProfile:
    try:
        return MODEL_PRESETS[name]()
    except KeyError:
        raise UnknownModel(f"no model preset '{name}'; use one of {sorted(MODEL_PRESETS)} "
                           "or a profile file (.toml or .json)") from None


def parse_model(text: str, source: str) -> ModelProfile:
    """A model profile from JSON or TOML text (the fields of `ModelProfile`)."""
    values = _load(text, source, UnknownModel)
    try:
        return ModelProfile.model_validate(values)
    except ValidationError as error:
        raise UnknownModel(describe_validation_error(error, ModelProfile, source)) from None
