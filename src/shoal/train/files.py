"""Files written whole: a reader sees the old file or the new one, never half
of one, and a crash right after leaves the new one on disk. No torch here:
the agent and the coordinator carry checkpoints with these too."""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: Path, blob: bytes) -> None:
    partial = path.with_name(path.name + ".tmp")
    with open(partial, "wb") as handle:
        handle.write(blob)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def prune_checkpoints(folder: Path, keep: int) -> None:
    """Keep the `keep` newest checkpoints (`step-N.json` manifest + payload) in `folder`;
    each older manifest goes first, so no manifest is ever left naming a missing payload."""
    for old in sorted(folder.glob("step-*.json"), reverse=True)[keep:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".pt").unlink(missing_ok=True)
