"""Imports run one way (DESIGN.md): a lower layer never imports a higher one,
and the pure layers import no torch, web framework, database or chain library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "shoal"

# Which shoal layers each layer may import (besides itself and the package root).
ALLOWED = {
    "spec": set(),
    "market": {"spec"},
    "plan": {"spec"},
    "proof": {"spec"},
    "ledger": {"spec"},
    "train": {"spec", "plan", "proof", "market"},
    "sim": {"spec", "market", "plan"},
    "control": {"spec", "market", "plan", "proof", "train", "ledger"},
    "jobs": {"spec", "train"},
    "cli": {"spec", "market", "plan", "proof", "train", "ledger", "control", "sim", "jobs"},
}
PURE = {"spec", "market", "plan", "proof"}
HEAVY = {"torch", "fastapi", "starlette", "uvicorn", "sqlalchemy", "psycopg", "psycopg2",
         "sqlite3", "web3", "eth_tester", "eth_account", "eth", "vyper", "flask", "aiohttp"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) > 1:
            yield parts[0], path


def test_every_layer_is_known():
    layers = {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert layers <= set(ALLOWED), f"add {layers - set(ALLOWED)} to DESIGN.md and this test"


@pytest.mark.parametrize("layer, path", list(_modules()), ids=lambda v: str(v))
def test_imports_follow_the_layers(layer, path):
    for name in _imports(path):
        top, _, rest = name.partition(".")
        if top == "shoal" and rest:
            target = rest.split(".")[0]
            assert target == layer or target in ALLOWED[layer], (
                f"{path.relative_to(PACKAGE)} ({layer}) imports shoal.{target}"
            )
        if layer in PURE:
            assert top not in HEAVY, f"pure layer {layer}: {path.name} imports {name}"
