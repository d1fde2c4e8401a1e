"""A job bundle's manifest: what a submitter's own job is made of (issue 41).

A market job that is the user's own is a bundle: the script `shoal run` would
take, the local modules it imports, its pinned requirements and a data URL,
packed into one archive whose SHA-256 names it (shoal.bundle). The manifest
inside says what each file is and its hash, so that workers, verifiers and the
referee each check they run the same code before running any of it.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from shoal.spec.base import Frozen
from shoal.spec.proof import SHA256_HEX
from shoal.spec.worker import WORKER_NAME

# What a bundled job's worker is told its job's steps and global batch by (the agent sets
# them; `run.batches` holds the script's loop to them): the job host ends the job at those
# steps and no others, so a script looping for fewer would leave the job open and its
# submitter paying, and the market planned and priced the job for that batch.
JOB_STEPS_ENV = "SHOAL_JOB_STEPS"
JOB_GLOBAL_BATCH_ENV = "SHOAL_JOB_GLOBAL_BATCH"

SHA256 = Annotated[str, Field(pattern=SHA256_HEX)]
# A file's place in a bundle: a relative POSIX path of plain components, each one as a
# worker's name is (letters, digits, '.', '_', '-'; never empty, '.' or '..'), so that
# unpacking it can only ever write inside the directory it is unpacked into.
_COMPONENT = re.compile(WORKER_NAME)
MAX_PATH_CHARS = 512
# One requirement as a bundle holds it: a distribution name, optional extras, `==` and an
# exact version; nothing a package index would resolve differently tomorrow.
PINNED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9._,-]+\])?"
                    r"==(?P<version>[A-Za-z0-9.+!_-]+)$")


def requirement_problem(line: str) -> str | None:
    """Why `line` cannot be a bundle's requirement, or None if it can."""
    match = PINNED.fullmatch(line)
    if match is None:
        return (f"{line!r} is not pinned: give each requirement as NAME==VERSION (as `pip "
                "freeze` writes it), so every provider builds the same environment")
    if match.group("name").lower() == "torch":
        return ("torch is the provider's (its version is part of each offer, and the auction "
                "matches it): drop it from the requirements")
    return None


def bundle_path_problem(path: str) -> str | None:
    """Why `path` cannot name a file in a bundle, or None if it can."""
    if not path or len(path) > MAX_PATH_CHARS:
        return f"a path of {len(path)} characters (1 to {MAX_PATH_CHARS})"
    bad = [c for c in path.split("/") if not _COMPONENT.fullmatch(c)]
    if bad:
        return (f"{path!r} has the component {bad[0]!r}: a bundle's paths are relative, "
                "of letters, digits, '.', '_' and '-', with no '..'")
    return None


# A torch release as offers and bundles name it: "2.13.0" (a local build tag such as
# "+cpu" is the device's business, which the offer's device kind says).
TORCH_RELEASE = r"^[0-9]{1,4}(\.[0-9]{1,4}){1,3}([a-z]+[0-9]{0,8})?$"
TorchRelease = Annotated[str, Field(pattern=TORCH_RELEASE)]


def torch_release(version: str) -> str:
    """The release of a torch version string (its local build tag dropped)."""
    return version.split("+", 1)[0]


class BundleFile(Frozen):
    """One file of a bundle: where it goes, its size and its SHA-256."""

    path: str
    size: int = Field(ge=0)
    sha256: SHA256

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        problem = bundle_path_problem(path)
        if problem:
            raise ValueError(problem)
        return path


class BundleManifest(Frozen):
    """What a bundle holds: the script to run (one of `files`), every file, the pinned
    requirements (torch is never one: it is the provider's, matched by the auction) with
    their hash (a provider builds one environment per requirements hash), and the data
    reference (an fsspec URL, or None for a script that makes its own)."""

    format: int = 1
    script: str
    files: tuple[BundleFile, ...] = Field(min_length=1)
    requirements: tuple[str, ...] = ()
    requirements_sha256: SHA256
    data: str | None = Field(default=None, max_length=2048)
    # The torch release the submitter wrote the script against (None: the script does not
    # care which). The market leases only devices whose agent runs that release.
    torch: TorchRelease | None = None

    @field_validator("requirements")
    @classmethod
    def _pinned(cls, lines: tuple[str, ...]) -> tuple[str, ...]:
        for line in lines:
            problem = requirement_problem(line)
            if problem:
                raise ValueError(problem)
        return lines

    @model_validator(mode="after")
    def _whole(self) -> BundleManifest:
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError("a bundle names a file twice")
        if self.script not in paths:
            raise ValueError(f"the script {self.script!r} is not one of the bundle's files")
        return self

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)
