"""The compiled contract shipped with the package: ABI and deploy bytecode.

Loading checks the artifact against the shipped source by hash, so a stale
build is a clear error rather than a contract that behaves unlike its code.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.ledger.errors import ArtifactError

PACKAGE_DIR = Path(__file__).resolve().parent
ARTIFACT_DIR = PACKAGE_DIR / "build"
CONTRACTS = ("compute_market",)


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: tuple[dict[str, Any], ...]
    bytecode: str  # 0x-prefixed deploy code, constructor arguments appended at deploy
    vyper: str  # compiler version that produced it
    source_sha256: str


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


@functools.cache
def load_artifact(name: str = "compute_market") -> Artifact:
    """The shipped artifact of `name`, verified against the shipped source."""
    path = ARTIFACT_DIR / f"{name}.json"
    if not path.exists():
        raise ArtifactError(
            f"{path} is missing; run `python -m shoal.ledger.build` (needs the test extra)"
        )
    data = json.loads(path.read_text())
    source = (PACKAGE_DIR / f"{name}.vy").read_text()
    if data["source_sha256"] != source_digest(source):
        raise ArtifactError(
            f"{path.name} was built from another version of {name}.vy; "
            "run `python -m shoal.ledger.build` and commit build/"
        )
    return Artifact(
        name=name,
        abi=tuple(data["abi"]),
        bytecode=data["bytecode"],
        vyper=data["vyper"],
        source_sha256=data["source_sha256"],
    )
