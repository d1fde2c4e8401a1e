"""Bench history: `--record` appends the printed result, with its provenance, one line
per run, and every bench that prints a result can record it."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

from bench.history import append_result, commit_of

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_appends_the_result_with_its_provenance(tmp_path):
    first = {"rto_s": 0.49, "shoal": {"steps_lost": 0}}
    path = append_result("elastic", first, tmp_path, argv=["-m", "bench.elastic", "--record"])
    append_result("elastic", {"rto_s": 0.51}, tmp_path, argv=["-m", "bench.elastic"])

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert path == tmp_path / "elastic.jsonl" and len(lines) == 2
    assert {k: lines[0][k] for k in first} == first and lines[1]["rto_s"] == 0.51
    assert lines[0]["command"] == "python -m bench.elastic --record"
    assert re.fullmatch(r"[0-9a-f]{4,40}(\+dirty)?|unknown", lines[0]["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", lines[0]["date"])


def test_refuses_a_result_that_names_a_provenance_key(tmp_path):
    with pytest.raises(ValueError, match="commit"):
        append_result("proof", {"commit": "mine"}, tmp_path, argv=[])
    assert not (tmp_path / "proof.jsonl").exists()


def test_commit_says_dirty_when_tracked_files_changed(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    assert commit_of(tmp_path) == "unknown"
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    clean = commit_of(tmp_path)
    (tmp_path / "untracked.txt").write_text("ignored")
    assert re.fullmatch(r"[0-9a-f]{4,40}", clean) and commit_of(tmp_path) == clean
    (tmp_path / "a.py").write_text("x = 2\n")
    assert commit_of(tmp_path) == clean + "+dirty"


def printing_benches() -> list[Path]:
    """The bench scripts whose `main` prints a JSON line."""
    found = []
    for path in sorted(BENCH.glob("*.py")):
        tree = ast.parse(path.read_text())
        mains = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
        if mains and "json.dumps" in ast.unparse(mains[0]) and "print(" in ast.unparse(mains[0]):
            found.append(path)
    return found


@pytest.mark.parametrize("path", printing_benches(), ids=lambda p: p.stem)
def test_every_printing_bench_can_record(path):
    source = path.read_text()
    assert '"--record"' in source, f"{path.name} prints a result but has no --record"
    assert f'append_result("{path.stem}", ' in source, f"{path.name} records under another name"
