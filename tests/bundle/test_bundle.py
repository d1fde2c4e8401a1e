"""Job bundles (issue 41): a submitter's script, its local modules and pinned
requirements packed under one hash, and a provider that unpacks only what the
manifest says, read as a hostile submitter would craft an archive."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from shoal.bundle import BundleError, pack_bundle, unpack_bundle
from shoal.bundle.pack import FILES, MANIFEST
from shoal.spec.bundle import BundleFile, BundleManifest

SCRIPT = """import json
import torch
import helper
from mypkg import model
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's directory: a script, a module and a package beside it, and what a bundle
    must leave out (caches, an unimported file)."""
    root = tmp_path / "project"
    (root / "mypkg").mkdir(parents=True)
    (root / "train.py").write_text(SCRIPT)
    (root / "helper.py").write_text("import os\nimport numpy\n")
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "model.py").write_text("from . import layers\n")
    (root / "mypkg" / "layers.py").write_text("WIDTH = 64\n")
    (root / "mypkg" / "__pycache__").mkdir()
    (root / "mypkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (root / "notes.py").write_text("never imported\n")
    (root / "requirements.txt").write_text(
        "# what pip freeze wrote\ntransformers==4.57.1\nnumpy == 2.1.0\n\nnumpy==2.1.0\n")
    return root


def test_a_script_is_bundled_with_its_local_modules_and_nothing_else(project: Path):
    bundle = pack_bundle(project / "train.py", requirements=project / "requirements.txt",
                         data="s3://corpus/tokens")
    manifest = bundle.manifest
    assert [f.path for f in manifest.files] == [
        "helper.py", "mypkg/__init__.py", "mypkg/layers.py", "mypkg/model.py", "train.py"]
    assert manifest.script == "train.py"
    assert manifest.requirements == ("numpy==2.1.0", "transformers==4.57.1")
    assert manifest.data == "s3://corpus/tokens"
    assert bundle.sha256 == hashlib.sha256(bundle.archive).hexdigest()


def test_the_same_sources_give_the_same_hash_and_any_change_another(project: Path):
    first = pack_bundle(project / "train.py", requirements=project / "requirements.txt")
    os.utime(project / "helper.py", (1, 1))  # times and owners are not content
    assert pack_bundle(project / "train.py",
                       requirements=project / "requirements.txt").sha256 == first.sha256
    (project / "mypkg" / "layers.py").write_text("WIDTH = 65\n")
    changed = pack_bundle(project / "train.py", requirements=project / "requirements.txt")
    assert changed.sha256 != first.sha256
    assert pack_bundle(project / "train.py").manifest.requirements_sha256 != \
        first.manifest.requirements_sha256


@pytest.mark.parametrize("line, says", [
    ("numpy>=2", "not pinned"),
    ("-e git+https://example.org/x.git", "not pinned"),
    ("https://example.org/pkg.whl", "not pinned"),
    ("torch==2.13.0", "torch is the provider's"),
])
def test_requirements_that_would_not_build_the_same_everywhere_are_refused(
        project: Path, line: str, says: str):
    (project / "requirements.txt").write_text(f"numpy==2.1.0\n{line}\n")
    with pytest.raises(BundleError, match=says):
        pack_bundle(project / "train.py", requirements=project / "requirements.txt")


def test_included_files_come_from_under_the_scripts_directory_only(project: Path, tmp_path):
    (project / "configs").mkdir()
    (project / "configs" / "small.json").write_text("{}")
    bundle = pack_bundle(project / "train.py", include=(Path("configs"),))
    assert "configs/small.json" in [f.path for f in bundle.manifest.files]
    (tmp_path / "secret.txt").write_text("the submitter's own key")
    with pytest.raises(BundleError, match="outside the script's directory"):
        pack_bundle(project / "train.py", include=(Path("../secret.txt"),))


def test_a_script_that_does_not_parse_fails_at_packing(project: Path):
    (project / "helper.py").write_text("def broken(:\n")
    with pytest.raises(BundleError, match="helper.py:1"):
        pack_bundle(project / "train.py")


def test_a_bundle_unpacks_to_its_files_checked_against_the_jobs_hash(project: Path, tmp_path):
    bundle = pack_bundle(project / "train.py", requirements=project / "requirements.txt")
    dest = tmp_path / "job"
    manifest = unpack_bundle(bundle.archive, bundle.sha256, dest)
    assert manifest == bundle.manifest
    for entry in manifest.files:
        assert (dest / entry.path).read_bytes() == (project / entry.path).read_bytes()
    with pytest.raises(BundleError, match="not empty"):
        unpack_bundle(bundle.archive, bundle.sha256, dest)


def test_an_archive_that_is_not_the_jobs_is_refused_and_nothing_written(project: Path,
                                                                        tmp_path):
    bundle = pack_bundle(project / "train.py")
    other = pack_bundle(project / "train.py", data="s3://elsewhere")
    with pytest.raises(BundleError, match="not the job's code"):
        unpack_bundle(other.archive, bundle.sha256, tmp_path / "job")
    assert not (tmp_path / "job").exists()


# -- a hostile submitter's archives: each names its own hash, so only the checks of
# -- its structure stand between it and the provider's disk ---------------------


def _manifest(files: dict[str, bytes], **fields: object) -> BundleManifest:
    return BundleManifest(
        script=next(iter(files)), requirements_sha256="0" * 64,
        files=tuple(BundleFile(path=p, size=len(b), sha256=hashlib.sha256(b).hexdigest())
                    for p, b in files.items()), **fields)


def _tar(entries: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """(name, data or None for a link, link target) entries, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data, target in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, target.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


SAFE = {"train.py": b"print('hi')\n"}
MANIFEST_BYTES = _manifest(SAFE).model_dump_json().encode()


@pytest.mark.parametrize("name, archive, says", [
    ("a member outside the manifest, climbing out",
     _tar([(MANIFEST, MANIFEST_BYTES, b""), (FILES + "train.py", SAFE["train.py"], b""),
           (FILES + "../../.ssh/authorized_keys", b"ssh-ed25519 AAAA", b"")]),
     "does not list"),
    ("a link where the script should be",
     _tar([(MANIFEST, MANIFEST_BYTES, b""), (FILES + "train.py", None, b"/etc/shadow")]),
     "not a regular file"),
    ("the script swapped after hashing",
     _tar([(MANIFEST, MANIFEST_BYTES, b""), (FILES + "train.py", b"import os; os.system('x')", b"")]),
     "is 25 bytes"),
    ("the script swapped, same size",
     _tar([(MANIFEST, MANIFEST_BYTES, b""), (FILES + "train.py", b"print('ha')\n", b"")]),
     "not the file its manifest names"),
    ("a second copy of a listed file",
     _tar([(MANIFEST, MANIFEST_BYTES, b""), (FILES + "train.py", SAFE["train.py"], b""),
           (FILES + "train.py", b"print('ha')\n", b"")]),
     "lists once"),
    ("a listed file missing", _tar([(MANIFEST, MANIFEST_BYTES, b"")]), "lacks 'train.py'"),
    ("no manifest first",
     _tar([(FILES + "train.py", SAFE["train.py"], b""), (MANIFEST, MANIFEST_BYTES, b"")]),
     "does not start with its manifest"),
    ("a manifest naming a path that climbs out",
     _tar([(MANIFEST, MANIFEST_BYTES.replace(b'"train.py"', b'"../../../etc/cron.d/x"'), b"")]),
     "does not parse"),
    ("a compressed archive (a bomb would inflate)",
     gzip.compress(_tar([(MANIFEST, MANIFEST_BYTES, b"")])), "not an uncompressed tar"),
])
def test_a_crafted_archive_writes_nothing(tmp_path: Path, name: str, archive: bytes, says: str):
    dest = tmp_path / "job"
    with pytest.raises(BundleError, match=says):
        unpack_bundle(archive, hashlib.sha256(archive).hexdigest(), dest)
    assert not dest.exists()
    assert not (tmp_path / ".ssh").exists()


def test_an_oversized_archive_is_refused_before_it_is_hashed(tmp_path: Path):
    archive = _tar([(MANIFEST, MANIFEST_BYTES, b""), (FILES + "train.py", SAFE["train.py"], b"")])
    with pytest.raises(BundleError, match="at most 100"):
        unpack_bundle(archive, hashlib.sha256(archive).hexdigest(), tmp_path / "job",
                      max_bytes=100)
    assert unpack_bundle(archive, hashlib.sha256(archive).hexdigest(), tmp_path / "job") \
        .script == "train.py"
