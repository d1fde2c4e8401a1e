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

SHA256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# A file's place in a bundle: a relative POSIX path of plain components (letters, digits,
# '.', '_', '-'; none empty, '.' or '..'), so that unpacking it can only ever write inside
# the directory it is unpacked into.
_COMPONENT = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
MAX_PATH_CHARS = 512
# One requirement as a bundle holds it: a distribution name, optional extras, `==` and an
# exact version; nothing a package index would resolve differently tomorrow.
PINNED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9._,-]+\])?"
                    r"==(?P<version>[A-Za-z0-9.+!_-]+)$")


def bundle_path_problem(path: str) -> str | None:
    """Why `path` cannot name a file in a bundle, or None if it can."""
    if not path or len(path) > MAX_PATH_CHARS:
        return f"a path of {len(path)} characters (1 to {MAX_PATH_CHARS})"
    bad = [c for c in path.split("/") if not _COMPONENT.fullmatch(c)]
    if bad:
        return (f"{path!r} has the component {bad[0]!r}: a bundle's paths are relative, "
                "of letters, digits, '.', '_' and '-', with no '..'")
    return None


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

    @field_validator("requirements")
    @classmethod
    def _pinned(cls, lines: tuple[str, ...]) -> tuple[str, ...]:
        for line in lines:
            match = PINNED.fullmatch(line)
            if match is None:
                raise ValueError(f"requirement {line!r} is not pinned as NAME==VERSION")
            if match.group("name").lower() == "torch":
                raise ValueError("torch is the provider's, not the bundle's")
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
