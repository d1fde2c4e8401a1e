"""The Python environments a provider builds for bundled jobs (issue 41): one per
requirements hash, built once and kept.

Each is a venv whose own site-packages hold the bundle's pinned requirements,
with the agent's environment behind them (a `.pth` file): torch, and shoal
itself, stay the provider's, the version its offer names, while a pin of the
bundle's wins over the provider's copy of the same package. A requirement the
provider already has at the pinned version is not downloaded again.

Builds go into a directory of their own and are renamed into place only once
pip succeeded, under a lock per hash, so two leases of jobs with the same
requirements build once, and a failed or interrupted build leaves nothing a
later lease would take for a finished one.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import logging
import os
import shutil
import site as site_module
import subprocess
import sysconfig
import time
import venv
from dataclasses import dataclass
from pathlib import Path

from shoal import ShoalError
from shoal.spec.bundle import BundleManifest, torch_release

log = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 1800.0  # pip resolving and downloading a large stack (transformers...)
_READY = "shoal-env.json"  # written last: an environment without it is not finished


class EnvironmentError_(ShoalError):
    """A bundle's environment cannot be built (a pin that does not exist, no index)."""


@dataclass(frozen=True)
class Environments:
    """Environments under `root`, keyed by requirements hash. `pip_args`: the provider's
    own index settings (`--index-url`, `--find-links`, `--no-index`), passed to every
    install."""

    root: Path
    pip_args: tuple[str, ...] = ()
    timeout_s: float = BUILD_TIMEOUT_S

    def python(self, manifest: BundleManifest) -> Path:
        """The interpreter of `manifest`'s environment, built now if it is not yet."""
        final = self.root / manifest.requirements_sha256
        if (final / _READY).is_file():
            return _interpreter(final)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{manifest.requirements_sha256}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another lease may be building it
            if not (final / _READY).is_file():
                self._build(manifest, final)
        return _interpreter(final)

    def _build(self, manifest: BundleManifest, final: Path) -> None:
        building = self.root / f".building-{manifest.requirements_sha256}-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)  # an unfinished one (no ready mark)
        started = time.monotonic()
        venv.EnvBuilder(with_pip=False, symlinks=True).create(building)
        site = Path(sysconfig.get_path("purelib", vars={"base": str(building),
                                                        "platbase": str(building)}))
        # Behind the venv's own packages: the agent's (torch, shoal, their dependencies),
        # each added as a site directory, so that its own .pth files (an editable shoal)
        # count too.
        (site / "zz-shoal-provider.pth").write_text("".join(
            f"import site; site.addsitedir({directory!r})\n"
            for directory in site_module.getsitepackages()))
        if manifest.requirements:
            # torch is the provider's: a pin that would pull in another (torchvision of
            # another release, say) fails here, with pip's reason, rather than shadow it.
            constraints = building / "shoal-constraints.txt"
            torch = provider_torch()
            constraints.write_text(f"torch=={torch}\n" if torch else "")
            # Wheels only: building a source distribution runs the package's own setup
            # code, here, as the agent, outside any sandbox; a wheel only unpacks.
            command = [str(_interpreter(building)), "-m", "pip", "install", "--quiet",
                       "--disable-pip-version-check", "--no-input", "--only-binary=:all:",
                       "-c", str(constraints), *self.pip_args, *manifest.requirements]
            try:
                done = subprocess.run(command, capture_output=True, text=True,
                                      timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                shutil.rmtree(building, ignore_errors=True)
                raise EnvironmentError_(f"installing the bundle's requirements took over "
                                        f"{self.timeout_s:.0f} s; nothing was kept") from None
            if done.returncode != 0:
                shutil.rmtree(building, ignore_errors=True)
                said = (done.stderr.strip().splitlines() or ["(pip said nothing)"])[-1]
                raise EnvironmentError_(f"pip could not install the bundle's requirements "
                                        f"({', '.join(manifest.requirements)}) from wheels "
                                        f"(a source build would run its code here): {said}")
        (building / _READY).write_text(json.dumps(
            {"requirements": list(manifest.requirements),
             "built_s": round(time.monotonic() - started, 1)}) + "\n")
        building.rename(final)
        log.info("built the environment %s… (%d requirements) in %.1f s",
                 manifest.requirements_sha256[:12], len(manifest.requirements),
                 time.monotonic() - started)


def provider_torch() -> str | None:
    """The torch release this agent's workers run on (None: none installed)."""
    try:
        return torch_release(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _interpreter(environment: Path) -> Path:
    return environment / "bin" / "python"
