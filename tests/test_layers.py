"""Imports run one way (DESIGN.md): a lower layer never imports a higher one, the pure
layers import no torch, web framework, database or chain library, the coordinator's
rooms run api -> services -> db, and no two modules import each other, however far
round the loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "shoal"

# Which shoal layers each layer may import (besides itself and the package root's modules).
ALLOWED = {
    "spec": set(),
    "market": {"spec"},
    "plan": {"spec"},
    "proof": {"spec"},
    "bundle": {"spec"},
    "ledger": {"spec"},
    "sim": {"spec", "market", "plan", "proof"},
    "client": {"spec"},
    "train": {"spec", "plan", "proof", "market"},
    "verify": {"spec", "plan", "proof", "market", "train", "client", "ledger"},
    "elastic": {"spec", "train"},
    "models": {"spec", "proof", "train", "verify"},
    "agent": {"spec", "proof", "market", "ledger", "client", "elastic", "train", "verify",
              "bundle"},
    "coordinator": {"spec", "market", "plan", "proof", "ledger", "client", "elastic", "train",
                    "verify", "bundle"},
    "demo": {"spec", "market", "plan", "proof", "ledger", "client", "elastic", "train",
             "verify", "coordinator", "agent", "models", "bundle"},
    "cli": {"spec", "market", "plan", "proof", "ledger", "client", "elastic", "train",
            "verify", "coordinator", "agent", "models", "demo", "sim", "bundle"},
}
PURE = {"spec", "market", "plan", "proof", "sim", "bundle"}
HEAVY = {"torch", "fastapi", "starlette", "uvicorn", "sqlalchemy", "psycopg", "psycopg2",
         "sqlite3", "web3", "eth_tester", "eth_account", "eth", "vyper", "flask", "aiohttp"}
# Inside the coordinator: routes -> services -> store, one way (full-stack-fastapi's shape).
# `proofs` are services of proof of learning; `dashboard` is an edge like `api`.
COORDINATOR_ALLOWED = {
    "db": set(),
    "services": {"db"},
    "proofs": {"db", "services"},
    "api": {"services", "proofs", "dashboard"},
    "dashboard": set(),
}
ROOT_MODULES = {p.stem for p in PACKAGE.glob("*.py")}


def _imports(path: Path) -> set[str]:
    """Every module a file names in an import, lazy (inside a function) ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).rpartition(".")[0] if path.name != "__init__.py" \
        else _module_name(path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _module_name(path: Path) -> str:
    parts = ("shoal",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) > 1 and "migrations" not in parts:
            yield parts[0], path


def test_every_layer_is_known():
    layers = {p.name for p in PACKAGE.iterdir()
              if p.is_dir() and not p.name.startswith("_") and (p / "__init__.py").exists()}
    assert layers <= set(ALLOWED), f"add {layers - set(ALLOWED)} to DESIGN.md and this test"


@pytest.mark.parametrize("layer, path", list(_modules()), ids=lambda v: str(v))
def test_imports_follow_the_layers(layer, path):
    for name in _imports(path):
        top, _, rest = name.partition(".")
        if top == "shoal" and rest:
            target = rest.split(".")[0]
            if target not in ALLOWED and target not in ROOT_MODULES:
                continue  # a name the package root defines (`from shoal import ShoalError`)
            assert target == layer or target in ALLOWED[layer] or target in ROOT_MODULES, (
                f"{path.relative_to(PACKAGE)} ({layer}) imports shoal.{target}"
            )
        if layer in PURE:
            assert top not in HEAVY, f"pure layer {layer}: {path.name} imports {name}"


def test_training_runtime_never_imports_proof_of_learning():
    """The runtime reaches `verify` only through the step hook a run is handed."""
    for path in (PACKAGE / "train").rglob("*.py"):
        hits = {n for n in _imports(path) if n.startswith("shoal.verify")}
        assert not hits, f"{path.relative_to(PACKAGE)} imports {sorted(hits)}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "coordinator").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_coordinator_rooms_run_api_services_db(path):
    room = path.relative_to(PACKAGE / "coordinator").parts[0]
    if room not in COORDINATOR_ALLOWED:
        return  # the package's own modules (settings, errors) serve every room
    for name in _imports(path):
        parts = name.split(".")
        if parts[:2] == ["shoal", "coordinator"] and len(parts) > 2 \
                and parts[2] in COORDINATOR_ALLOWED and parts[2] != room:
            assert parts[2] in COORDINATOR_ALLOWED[room], (
                f"coordinator/{path.relative_to(PACKAGE / 'coordinator')} ({room}) "
                f"imports shoal.coordinator.{parts[2]}")


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {resolve(n) for n in _imports(path)}
        # A package's __init__ re-exporting its own submodules is not a cycle of design.
        graph[module] = {t for t in targets if t and t != module
                         and not (path.name == "__init__.py" and t.startswith(module + "."))}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    """The check below cannot pass by finding nothing: a loop of three is seen."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = _cycles(_import_graph())
    assert not cycles, "modules that import each other: " + "; ".join(map(", ".join, cycles))


def test_coordinator_opens_sessions_only_in_db():
    """`db/store.py` is the one place a session is made: services ask it for one."""
    for path in (PACKAGE / "coordinator").rglob("*.py"):
        if "db" in path.relative_to(PACKAGE / "coordinator").parts[:1]:
            continue
        text = path.read_text()
        for needle in ("Session(", "sessionmaker"):
            assert needle not in text, (
                f"coordinator/{path.relative_to(PACKAGE / 'coordinator')} opens a session "
                f"({needle}): use the Store in coordinator/db/store.py")
