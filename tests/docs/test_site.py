"""The documentation site builds with `mkdocs build --strict` (any warning fails), and
its generated pages carry what the code defines: a page that stopped generating, or a
command, job-file key or HTTP path that fell out of one, fails here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def test_cli_reference_lists_every_command_with_its_options(site):
    text = page(site, "reference/cli")
    for expected in ("shoal run", "--workers", "shoal chain status", "shoal key new", "--chaos"):
        assert expected in text


def test_job_file_reference_lists_sections_keys_and_defaults(site):
    text = page(site, "reference/job-file")
    for expected in ("global_batch", "[sync]", "inner_steps", "epoch_steps", "runs/{name}/proof"):
        assert expected in text


def test_http_reference_lists_paths_and_their_models(site):
    text = page(site, "reference/http-api")
    for expected in ("POST /v1/jobs", "/v1/agents/{agent_id}/heartbeat", "JobSubmission",
                     "schema-heartbeatreply"):
        assert expected in text


def test_python_reference_renders_the_docstrings(site):
    text = page(site, "reference/python-api")
    for expected in ("shoal.join", "publish_final", "is_reporter", "ElasticOptimizer"):
        assert expected in text


def test_figures_page_is_built(site):
    assert "Figures" in page(site, "figures")


def load_figures():
    path = REPO / "docs" / "hooks" / "page_figures.py"
    spec = importlib.util.spec_from_file_location("page_figures_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_figures_say_so_when_nothing_is_recorded(tmp_path):
    (tmp_path / "proof.jsonl").write_text("")
    assert "No bench results are recorded yet" in load_figures().figures_page(tmp_path)


def test_figures_show_the_latest_run_and_chart_each_headline_per_variant(tmp_path):
    def line(fault, rto_s, commit):
        return json.dumps({"fault": fault, "rto_s": rto_s, "torchft_rto_s": None,
                           "steps_lost": 0, "commit": commit,
                           "date": "2026-01-01T00:00:00+00:00",
                           "command": f"python -m bench.elastic --fault {fault}"})

    runs = [line("kill", 0.5, "aaa1111"), line("stall", 1.1, "bbb2222"),
            line("kill", 0.4, "ccc3333")]
    (tmp_path / "elastic.jsonl").write_text("\n".join(runs))
    text = load_figures().figures_page(tmp_path)
    kill, stall = text.split("### elastic: fault = stall")
    assert "Latest of 2 recorded runs: commit `ccc3333`" in kill
    assert "python -m bench.elastic --fault kill" in kill
    assert "| `rto_s` | 0.4 | <svg" in kill and "rto_s = 0.5 at aaa1111" in kill
    assert "| `torchft_rto_s` | – |" in kill  # a reference that did not run: no figure
    assert "Latest of 1 recorded run: commit `bbb2222`" in stall and "0.5" not in stall
