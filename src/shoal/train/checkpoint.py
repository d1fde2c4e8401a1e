"""Disk checkpoints that training never waits for, and that survive `kill -9`.

A snapshot is copied in memory on the training thread (cheap), then
serialized, hashed and written by a background thread. Each checkpoint is
a payload file plus a manifest holding its SHA-256; both are written to a
temporary name, fsynced and renamed, and the manifest goes last, so a
checkpoint exists only once it is whole. Loading verifies the hash and
falls back to the previous good checkpoint if the newest is damaged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shoal.train.errors import CheckpointError
from shoal.train.files import (
    CHECKPOINT_FORMAT,
    checkpoint_manifests,
    manifest_step,
    payload_name,
    prune_checkpoints,
    write_checkpoint,
)
from shoal.train.state_file import StateFileError, decode, encode

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Snapshot:
    """Training state at a step boundary, detached from the live tensors."""

    step: int  # steps completed
    cursor: int  # stream position of the next sample
    state: dict[str, Any]  # model, optimizer, rng: tensors and plain values only


def detached_copy(state: Any) -> Any:
    """A copy of nested dicts/lists/tuples whose tensors no longer share memory with training."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {k: detached_copy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(detached_copy(v) for v in state)
    return state


def take_snapshot(step: int, cursor: int, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer) -> Snapshot:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "rng": torch.get_rng_state()}
    return Snapshot(step, cursor, detached_copy(state))


def restore_snapshot(snapshot: Snapshot, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer) -> None:
    model.load_state_dict(snapshot.state["model"])
    optimizer.load_state_dict(snapshot.state["optimizer"])
    torch.set_rng_state(snapshot.state["rng"])


class CheckpointStore:
    """The checkpoints of one job in one directory, written in the background."""

    def __init__(self, directory: str | Path, identity: dict[str, Any], keep: int = 3) -> None:
        self.directory = Path(directory)
        self.identity = identity
        self.keep = keep
        self.written = 0
        self.failures = 0
        self._pending: Snapshot | None = None
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    # -- writing ---------------------------------------------------------

    def save_async(self, snapshot: Snapshot) -> None:
        """Queue `snapshot` for writing; a not-yet-started older one is superseded."""
        with self._cond:
            if self._pending is not None:
                log.warning("checkpoint at step %d superseded by step %d before the disk "
                            "caught up", self._pending.step, snapshot.step)
            self._pending = snapshot
            self._cond.notify_all()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until every queued checkpoint is on disk."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise CheckpointError(f"checkpoint writer still busy after {timeout_s} s")
                self._cond.wait(remaining)

    def close(self) -> None:
        self.wait()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                snapshot, self._pending, self._busy = self._pending, None, True
            try:
                self._write(snapshot)
                self.written += 1
            except OSError as error:
                self.failures += 1
                log.error("checkpoint at step %d not written: %s (training goes on; "
                          "free disk space or change checkpoint.dir)", snapshot.step, error)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, snapshot: Snapshot) -> None:
        blob = encode({"step": snapshot.step, "cursor": snapshot.cursor, **snapshot.state})
        write_checkpoint(self.directory, snapshot.step, blob, self.identity, time.time())
        log.debug("checkpoint step %d written (%d bytes)", snapshot.step, len(blob))
        self._prune()

    def _prune(self) -> None:
        prune_checkpoints(self.directory, self.keep)

    # -- reading ---------------------------------------------------------

    def _manifests(self) -> list[Path]:
        """Manifests, newest step first."""
        return checkpoint_manifests(self.directory)

    def latest_step(self) -> int | None:
        manifests = self._manifests()
        return manifest_step(manifests[0]) if manifests else None

    def load_latest(self) -> Snapshot | None:
        """The newest checkpoint whose hash checks out; None if there are none at all."""
        manifests = self._manifests()
        for manifest_path in manifests:
            snapshot = self._load_verified(manifest_path)
            if snapshot is not None:
                return snapshot
        if manifests:
            raise CheckpointError(
                f"all {len(manifests)} checkpoints in {self.directory} are damaged; "
                "remove them (or pass --fresh) to start over"
            )
        return None

    def _load_verified(self, manifest_path: Path) -> Snapshot | None:
        try:
            step = manifest_step(manifest_path)  # a name that gives none: unreadable
            manifest = json.loads(manifest_path.read_text())
            if manifest.get("format") != CHECKPOINT_FORMAT:  # format 1: a torch archive
                log.warning("checkpoint %s is of format %r, which this shoal no longer reads "
                            "(it reads %d); trying the previous one", manifest_path.name,
                            manifest.get("format"), CHECKPOINT_FORMAT)
                return None
            # The payload's name is the step's, whatever the manifest says: a carried
            # manifest names no other file.
            blob = (self.directory / payload_name(step)).read_bytes()
        except (OSError, ValueError, IndexError, KeyError, AttributeError) as error:
            log.warning("checkpoint %s unreadable (%s); trying the previous one",
                        manifest_path.name, error)
            return None
        if len(blob) != manifest.get("bytes") \
                or hashlib.sha256(blob).hexdigest() != manifest.get("sha256"):
            log.warning("checkpoint %s is damaged (checksum mismatch); using the previous one",
                        manifest_path.stem)
            return None
        self._check_identity(manifest.get("identity", {}), manifest_path.stem)
        try:
            # A checkpoint may have come from another party (one the coordinator carried
            # between providers): read as a state file, nothing in it inflates.
            state = decode(blob, len(blob))
            if not (isinstance(state, dict) and state.get("step") == step
                    and isinstance(state.get("cursor"), int)):
                raise StateFileError("it holds no data cursor, or another step than its name's")
        except StateFileError as error:
            log.warning("checkpoint %s refused (%s); using the previous one",
                        manifest_path.stem, error)
            return None
        step, cursor = state.pop("step"), state.pop("cursor")
        return Snapshot(step, cursor, state)

    def _check_identity(self, found: dict[str, Any], name: str) -> None:
        if found == self.identity:
            return
        differences = [
            f"{key}: checkpoint has {found.get(key)!r}, job has {value!r}"
            for key, value in self.identity.items() if found.get(key) != value
        ]
        raise CheckpointError(
            f"checkpoint {self.directory / name} was written by a different job "
            f"({'; '.join(differences)[:300]}); point checkpoint.dir elsewhere or pass --fresh"
        )
