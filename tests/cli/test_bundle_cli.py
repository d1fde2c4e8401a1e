"""`shoal bundle`: the hash a job of one's own will carry, the archive written, and an
unpinned requirement said in one line."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from shoal.bundle import unpack_bundle
from tests.conftest import shoal_command


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(shoal_command("bundle", *args), capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_the_archive_written_is_the_one_the_hash_names(tmp_path: Path):
    (tmp_path / "train.py").write_text("import helper\n")
    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "requirements.txt").write_text("numpy==2.1.0\n")
    result = _run("train.py", "-r", "requirements.txt", "--data", "s3://b/k", "--out",
                  "job.tar", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    archive = (tmp_path / "job.tar").read_bytes()
    assert out["sha256"] == hashlib.sha256(archive).hexdigest()
    manifest = unpack_bundle(archive, out["sha256"], tmp_path / "unpacked")
    assert [f.path for f in manifest.files] == ["helper.py", "train.py"]
    assert manifest.data == "s3://b/k"


def test_an_unpinned_requirement_is_one_line_that_says_what_to_do(tmp_path: Path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "requirements.txt").write_text("transformers\n")
    result = _run("train.py", "-r", "requirements.txt", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "requirements.txt:1" in result.stderr and "NAME==VERSION" in result.stderr
