"""A provider's environments for bundled jobs (issue 41): built once per requirements
hash from the provider's own package index, the bundle's pins first and the provider's
torch and shoal behind them; a pin that cannot be installed leaves nothing behind."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import subprocess
import tarfile
import sys
import zipfile
from pathlib import Path

import pytest

from shoal.agent.environments import Environments, EnvironmentError_
from shoal.spec.bundle import BundleFile, BundleManifest


def _wheel(folder: Path, name: str, version: str, body: str, requires: str = "") -> None:
    """A pure-Python wheel of one module, as a package index would serve it."""
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires:
        metadata += f"Requires-Dist: {requires}\n"
    files = {
        f"{name}.py": body.encode(),
        f"{dist}/METADATA": metadata.encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = "".join(f"{path},sha256={_digest(data)},{len(data)}\n"
                     for path, data in files.items()) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
        wheel.writestr(f"{dist}/RECORD", record)


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _manifest(*requirements: str) -> BundleManifest:
    return BundleManifest(
        script="train.py", files=(BundleFile(path="train.py", size=0, sha256="0" * 64),),
        requirements=requirements,
        requirements_sha256=hashlib.sha256("\n".join(requirements).encode()).hexdigest())


@pytest.fixture
def environments(tmp_path: Path) -> Environments:
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "shoalpin", "1.0", "VERSION = '1.0'\n")
    _wheel(index, "shoalpin", "2.0", "VERSION = '2.0'\n")
    _wheel(index, "idna", "0.0.1", "__version__ = '0.0.1'\n")  # the provider has 3.x
    # A package that needs another torch, and that torch (a stand-in) on the index.
    _wheel(index, "torch", "9.0", "__version__ = '9.0'\n")
    _wheel(index, "needsnewtorch", "1.0", "", requires="torch>=9")
    return Environments(tmp_path / "envs", ("--no-index", "--find-links", str(index)))


def _python(python: Path, code: str) -> str:
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_environment_holds_the_pins_and_the_providers_torch_and_shoal(environments):
    import torch

    python = environments.python(_manifest("shoalpin==1.0"))
    said = _python(python, "import shoalpin, torch, shoal.bundle; "
                           "print(shoalpin.VERSION, torch.__version__)")
    assert said.split() == ["1.0", torch.__version__]
    # Built once: the same requirements reuse it; others get their own.
    assert environments.python(_manifest("shoalpin==1.0")) == python
    other = environments.python(_manifest("shoalpin==2.0"))
    assert other != python
    assert _python(other, "import shoalpin; print(shoalpin.VERSION)") == "2.0"


def test_a_bundles_pin_wins_over_the_providers_copy_which_stays_as_it_was(environments):
    import idna

    provider_version = idna.__version__
    python = environments.python(_manifest("idna==0.0.1"))
    assert _python(python, "import idna; print(idna.__version__)") == "0.0.1"
    assert _python(Path(sys.executable),
                   "import idna; print(idna.__version__)") == provider_version


def test_a_pin_that_cannot_be_installed_is_said_and_leaves_nothing(environments):
    with pytest.raises(EnvironmentError_, match="shoalpin==3.0"):
        environments.python(_manifest("shoalpin==3.0"))
    assert [p.name for p in environments.root.iterdir() if not p.name.endswith(".lock")] == []


def test_a_pin_that_pulls_in_another_torch_is_refused_not_installed(environments, monkeypatch):
    # torch is the provider's: installed, the index's torch 9.0 would shadow it in the
    # job's environment, and the job would run on a torch no offer named. (No pip
    # configuration of this machine's: its own constraints would hide whether ours hold.)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(EnvironmentError_, match="needsnewtorch==1.0"):
        environments.python(_manifest("needsnewtorch==1.0"))
    assert [p.name for p in environments.root.iterdir() if not p.name.endswith(".lock")] == []


def test_a_source_distribution_is_never_built_on_the_provider(environments, tmp_path):
    # Its setup.py would run here, as the agent (root, beside its key), outside the sandbox.
    index = Path(environments.pip_args[-1])
    marker = tmp_path / "setup-ran"
    package = tmp_path / "evilpkg-1.0"
    package.mkdir()
    (package / "setup.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from setuptools import setup\nsetup(name='evilpkg', version='1.0')\n")
    with tarfile.open(index / "evilpkg-1.0.tar.gz", "w:gz") as tar:
        tar.add(package, arcname="evilpkg-1.0")
    # Buildable here (setuptools is the provider's; no isolated build to fetch it).
    buildable = dataclasses.replace(environments,
                                    pip_args=("--no-build-isolation", *environments.pip_args))
    with pytest.raises(EnvironmentError_, match="from wheels"):
        buildable.python(_manifest("evilpkg==1.0"))
    assert not marker.exists()
