"""JSON-lines files that one process appends to while others read them (work records,
step logs, verdicts, membership epochs): one way to write a line and one rule for reading.

The rule: a reader takes the file up to its last newline. A last line without its newline
is still being written (read whole, it would fail to parse); it is read once it ends.
"""

from __future__ import annotations

import os
from pathlib import Path


def append(path: Path, *lines: str, sync: bool = True) -> None:
    """Add `lines` (each without its newline) to `path` in one write, so a reader never
    sees half of one beside another writer's; `sync`: on disk before this returns (a
    record is a commitment, and must outlive a crash that follows it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path, start: int = 0) -> tuple[list[str], int]:
    """The non-empty whole lines of `path` from byte `start`, and the offset just past
    them (where the next read starts); ([], start) when there is no file."""
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read()
    except FileNotFoundError:
        return [], start
    whole = data[: data.rfind(b"\n") + 1]
    lines = whole.decode(errors="replace").splitlines()
    return [line for line in lines if line.strip()], start + len(whole)
