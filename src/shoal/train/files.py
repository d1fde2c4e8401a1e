"""Files written whole: a reader sees the old file or the new one, never half
of one, and a crash right after leaves the new one on disk. No torch here:
the agent and the coordinator carry checkpoints with these too."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# A checkpoint's payload: a state file (shoal.train.state_file), named for its step.
# Format 1 was a torch archive (a zip torch inflates before anything looks at it).
CHECKPOINT_FORMAT = 2
PAYLOAD_SUFFIX = ".safetensors"


def payload_name(step: int, suffix: str = PAYLOAD_SUFFIX) -> str:
    """A checkpoint's file of `step` (its manifest's with suffix ".json")."""
    return f"step-{step:010d}{suffix}"


def write_whole(path: Path, blob: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    with open(partial, "wb") as handle:
        handle.write(blob)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def write_checkpoint(folder: Path, step: int, blob: bytes, identity: dict, written_at: float,
                     sha256: str | None = None, **extra: object) -> Path:
    """A checkpoint's payload `blob`, then its manifest (so a manifest never names a
    payload not yet whole), in `folder`; `sha256`: the blob's, where the caller checked
    it already (else hashed here); `extra` goes into the manifest as it is.
    Returns the manifest's path."""
    write_whole(folder / payload_name(step), blob)
    manifest = {"format": CHECKPOINT_FORMAT, "step": step, "payload": payload_name(step),
                "bytes": len(blob), "sha256": sha256 or hashlib.sha256(blob).hexdigest(),
                "identity": identity, "written_at": written_at, **extra}
    path = folder / payload_name(step, ".json")
    write_whole(path, json.dumps(manifest, indent=1).encode())
    return path


def checkpoint_manifests(folder: Path) -> list[Path]:
    """The manifests (`step-N.json`, written after their payload) in `folder`, newest first."""
    return sorted(folder.glob("step-*.json"), reverse=True) if folder.is_dir() else []


def manifest_step(manifest: Path) -> int:
    """The step a manifest's name gives (`step-0000000042.json`: 42)."""
    return int(manifest.stem.split("-")[1])


def prune_checkpoints(folder: Path, keep: int) -> None:
    """Keep the `keep` newest checkpoints (`step-N.json` manifest + payload) in `folder`;
    each older manifest goes first, so no manifest is ever left naming a missing payload."""
    for old in checkpoint_manifests(folder)[keep:]:
        old.unlink(missing_ok=True)
        old.with_suffix(PAYLOAD_SUFFIX).unlink(missing_ok=True)
