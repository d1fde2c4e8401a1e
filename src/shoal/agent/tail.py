"""Reading what a worker appends to a JSON-lines file, from where the last read
stopped: only whole lines (a line still being written waits for the next
read)."""

from __future__ import annotations

from pathlib import Path

from shoal import jsonl


class Tail:
    def __init__(self) -> None:
        self._read: dict[Path, int] = {}  # file -> bytes consumed

    def new_lines(self, path: Path) -> tuple[list[str], int]:
        """The whole lines appended to `path` since the last `consumed`, and the offset to
        hand to `consumed` once they were delivered (until then they are read again)."""
        return jsonl.read(path, self._read.get(path, 0))

    def consumed(self, path: Path, offset: int) -> None:
        self._read[path] = offset
