"""Reading what a worker appends to a JSON-lines file, from where the last read
stopped: only whole lines (a line still being written waits for the next
read)."""

from __future__ import annotations

from pathlib import Path

from shoal import jsonl


# At most this much of a file is read at a time: a bundled job writes its step log on a
# disk of its own, and could make it as large as that disk.
READ_LIMIT = 1 << 20


class Tail:
    def __init__(self) -> None:
        self._read: dict[Path, int] = {}  # file -> bytes consumed

    def new_lines(self, path: Path) -> tuple[list[str], int]:
        """The whole lines appended to `path` since the last `consumed` (at most
        READ_LIMIT bytes of them; the rest at the next read), and the offset to hand to
        `consumed` once they were delivered (until then they are read again). A link is
        not followed."""
        return jsonl.read(path, self._read.get(path, 0), limit=READ_LIMIT)

    def consumed(self, path: Path, offset: int) -> None:
        self._read[path] = offset
