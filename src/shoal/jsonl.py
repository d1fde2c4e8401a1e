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


def read(path: Path, start: int = 0, limit: int | None = None) -> tuple[list[str], int]:
    """The non-empty whole lines of `path` from byte `start`, and the offset just past
    them (where the next read starts); ([], start) when there is no file.

    `limit`: a file another party writes (a bundled job's step log, on a provider): at
    most that many bytes are read, a link is not followed, and a line longer than the
    limit is skipped, so that no file it writes holds the reader's memory or points it
    at one of the reader's own."""
    try:
        if limit is None:
            with path.open("rb") as handle:
                handle.seek(start)
                data = handle.read()
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as handle:
                handle.seek(start)
                data = handle.read(limit)
    except FileNotFoundError:
        return [], start
    except OSError:  # a link, a FIFO: nothing of a worker's
        if limit is None:
            raise
        return [], start
    if limit is not None and len(data) == limit and b"\n" not in data:
        return [], start + len(data)  # one line longer than anything a worker writes
    whole = data[: data.rfind(b"\n") + 1]
    lines = whole.decode(errors="replace").splitlines()
    return [line for line in lines if line.strip()], start + len(whole)
