"""Byte-level corpora: the standard library's sources by default, or your text.

The corpus is read once into two uint8 arrays (train and validation); the
split is fixed by file path (or by position for a single file), so it is the
same on every machine and every run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal.spec import DataSpec
from shoal.models.errors import CorpusError

log = logging.getLogger(__name__)

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", ".git", ".venv", "node_modules"}


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray  # uint8, the training bytes in file order
    val: np.ndarray  # uint8, the validation bytes
    files: int  # files read
    source: str  # where the bytes came from, for logs and reports

    def num_samples(self, context: int) -> int:
        """Non-overlapping training windows of context+1 bytes (input and next-byte target)."""
        return max(0, (len(self.train) - 1) // context)

    def windows(self, sample_ids: np.ndarray, context: int) -> np.ndarray:
        """(B, context+1) int64 array of the training windows with these ids."""
        offsets = sample_ids.astype(np.int64)[:, None] * context + np.arange(context + 1)
        return self.train[offsets].astype(np.int64)

    def val_windows(self, count: int, context: int) -> np.ndarray:
        """(count, context+1) int64: evenly spaced, fixed validation windows."""
        last_start = len(self.val) - context - 1
        starts = np.linspace(0, last_start, num=count).astype(np.int64)
        return self.val[starts[:, None] + np.arange(context + 1)].astype(np.int64)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_validation_file(relative: str, val_fraction: float) -> bool:
    # Hash of the path, not of the contents, so the split is stable across
    # Python patch releases that edit a file.
    digest = hashlib.sha256(relative.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < val_fraction


def _walk(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
        found += [Path(directory) / n for n in sorted(names) if n.endswith(suffixes)]
    return found


def _read_directory(root: Path, spec: DataSpec, suffixes: tuple[str, ...]) -> Corpus:
    # With a cap, each side of the split gets its share of it, so that a
    # small cap still yields validation files.
    cap = spec.max_bytes
    val_cap = None if cap is None else max(1, int(cap * spec.val_fraction))
    caps = {True: val_cap, False: None if cap is None else cap - val_cap}
    parts: dict[bool, list[bytes]] = {True: [], False: []}
    sizes = {True: 0, False: 0}
    files = 0
    for path in _walk(root, suffixes):
        is_val = _is_validation_file(path.relative_to(root).as_posix(), spec.val_fraction)
        limit = caps[is_val]
        if limit is not None and sizes[is_val] >= limit:
            if all(caps[side] is not None and sizes[side] >= caps[side] for side in caps):
                break
            continue
        try:
            blob = path.read_bytes()
        except OSError as error:
            log.warning("skipping unreadable %s: %s", path, error)
            continue
        if limit is not None:
            blob = blob[: limit - sizes[is_val]]
        parts[is_val].append(blob)
        sizes[is_val] += len(blob)
        files += 1
    as_array = lambda side: np.frombuffer(b"".join(parts[side]), dtype=np.uint8)  # noqa: E731
    return Corpus(as_array(False), as_array(True), files, str(root))


def _read_file(path: Path, spec: DataSpec) -> Corpus:
    try:
        blob = path.read_bytes()
    except OSError as error:
        raise CorpusError(f"cannot read corpus file '{path}': {error}") from None
    if spec.max_bytes is not None:
        blob = blob[: spec.max_bytes]
    split = len(blob) - int(len(blob) * spec.val_fraction)
    data = np.frombuffer(blob, dtype=np.uint8)
    return Corpus(data[:split], data[split:], 1, str(path))


def load_corpus(spec: DataSpec, context: int) -> Corpus:
    """Read the corpus named by `spec` and check it can feed a model of `context`."""
    if spec.corpus == "stdlib":
        corpus = _read_directory(stdlib_root(), spec, (".py",))
    else:
        path = Path(spec.corpus).expanduser()
        if not path.exists():
            raise CorpusError(
                f"corpus '{spec.corpus}' not found; give a text file, a directory, or \"stdlib\""
            )
        reader = _read_directory if path.is_dir() else None
        corpus = reader(path, spec, spec.suffixes) if reader else _read_file(path, spec)
    if len(corpus.train) == 0:
        raise CorpusError(
            f"corpus '{corpus.source}' is empty (no bytes in files ending {', '.join(spec.suffixes)})"
        )
    needed = 2 * (context + 1)
    if len(corpus.train) < needed or len(corpus.val) < context + 1:
        raise CorpusError(
            f"corpus '{corpus.source}' is too small: {len(corpus.train)} training and "
            f"{len(corpus.val)} validation bytes for a context of {context}; "
            "add text, lower model.context, or change data.val_fraction"
        )
    log.info(
        "corpus %s: %d files, %.1f MB train, %.1f MB validation",
        corpus.source, corpus.files, len(corpus.train) / 1e6, len(corpus.val) / 1e6,
    )
    return corpus
