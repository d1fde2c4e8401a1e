"""The shipped ABI and bytecode are what the shipped source compiles to."""

from __future__ import annotations

import json
import shutil

import pytest

from shoal.ledger import ArtifactError
from shoal.ledger import artifact as artifact_module
from shoal.ledger.artifact import ARTIFACT_DIR, CONTRACTS, load_artifact
from shoal.ledger.build import compile_contract, render


@pytest.mark.parametrize("name", CONTRACTS)
def test_shipped_build_matches_source(name):
    shipped = (ARTIFACT_DIR / f"{name}.json").read_text()
    assert shipped == render(compile_contract(name)), "run `python -m shoal.ledger.build` and commit build/"


def test_stale_build_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "ledger"
    shutil.copytree(artifact_module.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    source = package / "compute_market.vy"
    source.write_text(source.read_text() + "\n# edited after the build\n")
    monkeypatch.setattr(artifact_module, "PACKAGE_DIR", package)
    monkeypatch.setattr(artifact_module, "ARTIFACT_DIR", package / "build")
    load_artifact.cache_clear()
    try:
        with pytest.raises(ArtifactError, match="shoal.ledger.build"):
            load_artifact()
        (package / "build" / "compute_market.json").unlink()
        with pytest.raises(ArtifactError, match="missing"):
            load_artifact()
    finally:
        load_artifact.cache_clear()


def test_artifact_has_every_operation():
    functions = {item["name"] for item in load_artifact().abi if item["type"] == "function"}
    assert {"create_job", "fund", "open_leases", "accept", "anchor", "book", "settle", "reclaim", "payout",
            "claim", "withdraw", "stake", "unbond", "release_stake", "slash", "open_dispute",
            "resolve_dispute", "expire_dispute"} <= functions
    assert json.loads(json.dumps(load_artifact().abi))  # plain JSON, as shipped
