"""Pack a script, the local modules it imports and its pinned requirements into a
bundle whose SHA-256 names it.

The archive is byte-for-byte the same for the same inputs (files in path order,
times, owners and modes fixed), so a submitter can say in advance which hash its
job will carry, and anyone can rebuild it from the same sources to check.

Local modules are found as Python finds them for `python SCRIPT`: an import
whose top-level name is a module or package beside the script (and, in turn,
what those import) is the submitter's and goes in; anything else (the standard
library, an installed package) is the environment's and does not. A package
goes in whole (its `.py` files), as an import of it may reach any of them.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from shoal import ShoalError
from shoal.spec.bundle import (BundleFile, BundleManifest, bundle_path_problem,
                               requirement_problem, torch_release)

MANIFEST = "shoal-bundle.json"
FILES = "files/"  # the archive holds MANIFEST and, under this, each file
MAX_BUNDLE_BYTES = 256 << 20  # code and small data: larger data goes by URL
_EXCLUDED_DIRS = {"__pycache__", ".git", ".venv", "venv", ".mypy_cache", ".pytest_cache"}


class BundleError(ShoalError):
    """A bundle that cannot be built, or one that is not what it says."""


@dataclass(frozen=True)
class Bundle:
    """A packed bundle: its archive's bytes, their SHA-256 (the bundle's name) and what
    its manifest says."""

    archive: bytes
    sha256: str
    manifest: BundleManifest


def pack_bundle(script: Path, *, requirements: Path | None = None,
                include: tuple[Path, ...] = (), data: str | None = None,
                torch: str | None = None) -> Bundle:
    """Pack `script` with the local modules it imports, the files and directories in
    `include` (relative to the script's directory), `requirements` (a pip requirements
    file of NAME==VERSION lines) and the data reference `data`. `torch`: the release the
    script needs on providers (default: the one installed here, which it was run on)."""
    script = script.resolve()
    if not script.is_file() or script.suffix != ".py":
        raise BundleError(f"{script} is not a Python script: give the file `shoal run` "
                          "would take")
    root = script.parent
    found = {script} | _local_modules(script, root)
    for extra in include:
        path = (root / extra).resolve()
        if not path.exists():
            raise BundleError(f"--include {extra}: no such file or directory under {root}")
        found |= set(_files_under(path)) if path.is_dir() else {path}
    entries = {_relative(path, root): path.read_bytes() for path in found}
    lines = _requirements(requirements) if requirements is not None else ()
    try:
        manifest = BundleManifest(
            script=_relative(script, root),
            files=tuple(BundleFile(path=p, size=len(b), sha256=_sha256(b))
                        for p, b in sorted(entries.items())),
            requirements=lines,
            requirements_sha256=_sha256("\n".join(lines).encode()),
            data=data, torch=_torch_here() if torch is None else torch)
    except ValidationError as error:
        raise BundleError(f"cannot bundle {script.name}: {_first(error)}") from None
    archive = _archive(manifest, entries)
    if len(archive) > MAX_BUNDLE_BYTES:
        raise BundleError(f"the bundle is {len(archive) >> 20} MiB (at most "
                          f"{MAX_BUNDLE_BYTES >> 20}): pass large data by URL (--data), "
                          "not in the bundle")
    return Bundle(archive=archive, sha256=_sha256(archive), manifest=manifest)


def _torch_here() -> str | None:
    """The torch release installed beside this Python (read from its metadata: packing
    imports no torch), or None where there is none."""
    try:
        return torch_release(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _local_modules(script: Path, root: Path) -> set[Path]:
    """The files of every module beside `root` that `script` imports, and so on."""
    found: set[Path] = set()
    pending = [script]
    while pending:
        source = pending.pop()
        try:
            tree = ast.parse(source.read_bytes(), filename=str(source))
        except SyntaxError as error:
            raise BundleError(f"{source}:{error.lineno}: {error.msg} (the bundle's code must "
                              "at least parse)") from None
        for name in _imported(tree, source, root):
            for path in _module_files(root, name):
                if path not in found:
                    found.add(path)
                    pending.append(path)
    return found


def _imported(tree: ast.AST, source: Path, root: Path) -> set[str]:
    """Top-level module names `tree` imports; relative imports resolve to the source's
    own package (a local one)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif node.level and source.parent != root:
                names.add(source.relative_to(root).parts[0])
    return names


def _module_files(root: Path, name: str) -> list[Path]:
    module, package = root / f"{name}.py", root / name
    if module.is_file():
        return [module]
    if package.is_dir() and (package / "__init__.py").is_file():
        return [p for p in _files_under(package) if p.suffix == ".py"]
    return []


def _files_under(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()
                  and not _EXCLUDED_DIRS.intersection(p.relative_to(directory).parts)
                  and p.suffix != ".pyc")


def _relative(path: Path, root: Path) -> str:
    try:
        relative = path.resolve().relative_to(root).as_posix()
    except ValueError:
        raise BundleError(f"{path} is outside the script's directory {root}: a bundle holds "
                          "only files under it") from None
    problem = bundle_path_problem(relative)
    if problem:
        raise BundleError(f"cannot bundle {relative}: {problem}")
    return relative


def _requirements(path: Path) -> tuple[str, ...]:
    """The pinned lines of a requirements file (comments and blank lines dropped)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise BundleError(f"cannot read the requirements {path}: {error.strerror}") from None
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip().replace(" ", "")
        if not line:
            continue
        problem = requirement_problem(line)
        if problem:
            raise BundleError(f"{path}:{number}: {problem}")
        lines.append(line)
    return tuple(sorted(set(lines), key=str.lower))


def _archive(manifest: BundleManifest, entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, manifest.model_dump_json(indent=1).encode())
        for path in sorted(entries):
            _add(tar, FILES + path, entries[path])
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _first(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]
