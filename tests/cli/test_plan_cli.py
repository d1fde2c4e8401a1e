"""`shoal plan`: a table or one JSON object for an example cluster; a bad file is one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import shoal_command

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "world-wide.json"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(shoal_command("plan", *args), capture_output=True, text=True,
                          timeout=120)


def test_json_on_an_example_cluster():
    result = _run(str(CLUSTER), "--model", "gpt3-xl", "--json", "--seed", "3")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    for key in ("step_time_s", "random_step_time_s", "greedy_step_time_s", "dp", "pp", "stages",
                "mode", "codec", "slt", "search_s"):
        assert key in out
    assert len(out["stages"]) == out["pp"] and all(len(s) == out["dp"] for s in out["stages"])
    assert out["step_time_s"] < out["random_step_time_s"]
    assert out["mode"] in ("allreduce", "diloco")
    assert out["codec"] in ("none", "int8", "topk", "powersgd", "sparseloco")
    # Staleness only where the runtime takes it: DiLoCo, uncompressed.
    assert out["slt"] == 0 or (out["mode"], out["codec"]) == ("diloco", "none")


def test_table(tmp_path):
    model = tmp_path / "model.toml"
    model.write_text("name = 'mini'\nlayers = 4\nwidth = 64\nparameters = 200000\n"
                     "activation_bytes_per_sample = 8192.0\nflops_per_sample = 1e9\n")
    result = _run(str(CLUSTER), "--model", str(model))
    assert result.returncode == 0, result.stderr
    assert "mini" in result.stdout and "random" in result.stdout and "greedy" in result.stdout


def test_bad_cluster_file_is_one_line(tmp_path):
    bad = tmp_path / "cluster.json"
    bad.write_text(json.dumps({"devices": [{"name": "a", "tflops": 1, "memory_gb": 1}],
                               "latency_ms": [[0]]}))
    result = _run(str(bad), "--model", "gpt3-xl")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("shoal: error:")]
    assert len(lines) == 1 and "bandwidth_gbps" in lines[0]
    missing = _run(str(tmp_path / "absent.json"), "--model", "gpt3-xl")
    assert missing.returncode == 2 and "not found" in missing.stderr
