"""Cluster and model descriptions: what is accepted, and what is refused with a way out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shoal.plan import InvalidCluster, UnknownModel, model_preset, parse_cluster, parse_model, topology

DEVICES = [{"name": "a", "tflops": 100, "memory_gb": 40, "region": "us"},
           {"name": "b", "tflops": 50, "memory_gb": 16, "region": "eu"}]


def _json(**extra) -> str:
    return json.dumps({"devices": DEVICES, **extra})


def test_matrices_in_device_order():
    top = topology(parse_cluster(_json(latency_ms=[[0, 40], [40, 0]],
                                       bandwidth_gbps=[[0, 2], [2, 0]]), "c.json"))
    assert top.latency_s[0, 1] == pytest.approx(0.04)
    assert top.bandwidth[0, 1] == pytest.approx(2e9 / 8)
    assert np.isinf(top.bandwidth[0, 0]) and top.latency_s[1, 1] == 0.0


def test_region_defaults_and_links_in_toml():
    text = """
inter_region_latency_ms = 120.0
[[devices]]
name = "a"
tflops = 100
memory_gb = 40
region = "us"
[[devices]]
name = "b"
tflops = 100
memory_gb = 40
region = "us"
[[devices]]
name = "c"
tflops = 100
memory_gb = 40
region = "eu"
[[region_links]]
a = "eu"
b = "us"
latency_ms = 70.0
bandwidth_gbps = 3.0
"""
    top = topology(parse_cluster(text, "c.toml"))
    assert top.latency_s[0, 1] == pytest.approx(0.0005)  # same region: the intra default
    assert top.bandwidth[0, 1] == pytest.approx(100e9 / 8)
    assert top.latency_s[0, 2] == pytest.approx(0.07)  # the listed link beats the default
    assert top.bandwidth[2, 1] == pytest.approx(3e9 / 8)


@pytest.mark.parametrize("text, fragment", [
    ("{not json", "malformed JSON"),
    ("[]", "table of keys"),
    (json.dumps({"devices": []}), "'devices'"),
    (json.dumps({"devices": DEVICES + DEVICES[:1]}), "listed twice"),
    (_json(latency_ms=[[0, 1], [1, 0]]), "both latency_ms and bandwidth_gbps"),
    (_json(latency_ms=[[0, 1]], bandwidth_gbps=[[0, 1]]), "must be 2x2"),
    (_json(latency_ms=[[0, 1], [1, 0]], bandwidth_gbps=[[0, 0], [1, 0]]), "bandwidth_gbps[0][1]"),
    (_json(colour="red"), "unknown key 'colour'"),
    (json.dumps({"devices": [{"name": "a", "tflops": -1, "memory_gb": 1}]}), "tflops"),
])
def test_bad_clusters_are_refused(text, fragment):
    with pytest.raises(InvalidCluster) as error:
        parse_cluster(text, "c.json")
    assert fragment in str(error.value)
    assert "\n" not in str(error.value)


def test_models():
    assert model_preset("gpt3-xl").layers == 24 and model_preset("gpt3-xl").width == 2048
    assert model_preset("tiny-gpt").layers == 4
    with pytest.raises(UnknownModel, match="gpt3-xl"):
        model_preset("gpt-5")
    profile = parse_model('layers = 2\nwidth = 8\nparameters = 100\n'
                          'activation_bytes_per_sample = 16.0\nflops_per_sample = 1e6\n', "m.toml")
    assert profile.batch_samples == 512
    with pytest.raises(UnknownModel, match="'layers' is required"):
        parse_model("{}", "m.json")
