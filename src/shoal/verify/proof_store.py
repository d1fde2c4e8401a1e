"""A job's proof-of-learning material on disk (where: `shoal.proof.layout`): written by
its workers, read back by verifiers and the referee.

Parameters and contributions are kept for the challenge window only
(`keep_epochs` proof epochs behind the newest, and at least `keep_s` seconds),
so the disk a job needs is bounded; records are small and kept for the job's life. The
tensor files are safetensors (`shoal.verify.kept_files`, which says why): a verifier loads
files that workers wrote, and a file from a stranger must never run code.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

import torch

from shoal import jsonl
from shoal.proof.layout import ProofLayout, step_of
from shoal.spec.audit import BlobKind
from shoal.spec.proof import WorkRecord
from shoal.verify.kept_files import (UnreadableFile, local_bytes, local_from, params_bytes,
                                    params_from, reveal_bytes, reveal_from)

__all__ = ["ProofStore", "UnreadableFile", "contribution_norm", "contribution_sha256"]

COMMITMENT_DOMAIN = b"shoal-contribution-v1"


def contribution_sha256(job: str, worker: str, step: int, tensors: list[torch.Tensor]) -> str:
    """The commitment to a contribution, bound to who sent it for which step (a copied
    commitment cannot be opened by anyone else)."""
    digest = hashlib.sha256(COMMITMENT_DOMAIN)
    for part in (job, worker, str(step)):
        digest.update(b"\x00" + part.encode())
    for t in tensors:
        flat = t.detach().contiguous().reshape(-1).cpu()
        digest.update(f"\x00{flat.dtype}:{flat.numel()}".encode())
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def contribution_norm(tensors: list[torch.Tensor]) -> float | None:
    """The l2 norm of a contribution, or None when it is not finite (a NaN loss's)."""
    norm = float(torch.sqrt(sum((t.detach().double() ** 2).sum() for t in tensors)))
    return norm if math.isfinite(norm) else None


class ProofStore:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.layout = ProofLayout(self.dir)
        self._cache: dict[Path, tuple[tuple[int, int], list[WorkRecord]]] = {}
        self._merged: tuple | None = None
        self._max_file_bytes: int | None = None

    def limit_file_bytes(self, limit: int) -> None:
        """Read no kept file past `limit` bytes (`kept_files.kept_file_bound`): a larger
        one is unreadable, its writer's fault."""
        self._max_file_bytes = limit

    # -- writing (workers) ------------------------------------------------------

    def append_record(self, record: WorkRecord) -> None:
        jsonl.append(self.layout.records(record.worker), record.model_dump_json())

    def save_params(self, step: int, state: dict[str, torch.Tensor]) -> None:
        """The parameters `step` starts from; written at every attempt of the step (the
        same values, unless the step is redone after a restore: then the newest stand)."""
        _write_atomic(params_bytes(state), self.layout.params(step))

    def save_reveal(self, worker: str, step: int, tensors: list[torch.Tensor]) -> None:
        _write_atomic(reveal_bytes(tensors), self.layout.reveal(worker, step))

    def save_local(self, worker: str, step: int, params: dict[str, torch.Tensor],
                   optimizer_state: dict) -> None:
        """Under DiLoCo, the state WORKER's own step `step` starts from (its replica's)."""
        _write_atomic(local_bytes(params, optimizer_state), self.layout.local(worker, step))

    def prune(self, worker: str, keep_from_step: int, keep_s: float = 0.0) -> None:
        """Drop this worker's reveals and local states (and, for everyone, parameters)
        before the window: steps before `keep_from_step` whose files are also older than
        `keep_s` seconds."""
        written_before = time.time() - keep_s
        for kind in (BlobKind.reveal, BlobKind.local, BlobKind.params):
            folder = self.layout.kept_dir(kind, worker)
            if not folder.is_dir():
                continue
            old = sorted((step, p) for p in folder.iterdir()
                         if (step := step_of(p)) is not None and step < keep_from_step)
            # Steps are written in order, so the first file young enough ends the pass:
            # each step looks at one file kept by the time floor, not all of them.
            for _, path in old:
                try:
                    if path.stat().st_mtime >= written_before:
                        break
                    path.unlink(missing_ok=True)
                except FileNotFoundError:
                    continue  # pruned by a peer sharing the folder

    def save_anchor(self, epoch: int, root: bytes, leaves: list[bytes]) -> None:
        """The leaves an anchored root was built from, in tree order: published by the
        operator so anyone can prove each record, and find one changed since."""
        path = self.layout.anchor(epoch)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"epoch": epoch, "root": root.hex(),
                                    "leaves": [leaf.hex() for leaf in leaves]}))

    # -- reading (verifiers) ------------------------------------------------------

    def load_anchor(self, epoch: int) -> tuple[bytes, list[bytes]] | None:
        path = self.layout.anchor(epoch)
        if not path.exists():
            return None
        body = json.loads(path.read_text())
        return bytes.fromhex(body["root"]), [bytes.fromhex(leaf) for leaf in body["leaves"]]

    def workers(self) -> list[str]:
        folder = self.layout.records_dir
        return sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []

    def records(self, worker: str | None = None) -> list[WorkRecord]:
        """Every record (of one worker, or all); for a step recorded twice by a worker (a
        step redone after a restore), the last one stands."""
        parsed = [self._parsed(self.layout.records(name))
                  for name in ([worker] if worker else self.workers())]
        # Merged and sorted again only once a file changed: a DiLoCo audit reads every
        # record of the job for each record it audits.
        key = (worker, tuple(id(p) for p in parsed))
        if self._merged is not None and self._merged[0] == key:
            return list(self._merged[1])
        latest: dict[tuple[str, int], WorkRecord] = {}
        for records in parsed:
            for record in records:
                latest[(record.worker, record.step)] = record
        merged = sorted(latest.values(), key=lambda r: (r.step, r.worker))
        self._merged = (key, merged, parsed)  # the lists kept alive: their ids stay theirs
        return list(merged)

    def _parsed(self, path: Path) -> list[WorkRecord]:
        """A records file's records, parsed again only once it changed (files only grow:
        an audit that reads a worker's whole history does not re-parse it per record)."""
        try:
            stat = path.stat()
        except FileNotFoundError:
            return []
        cached = self._cache.get(path)
        if cached is not None and cached[0] == (stat.st_size, stat.st_mtime_ns):
            return cached[1]
        # Its worker may be appending a record right now: read up to its last whole line
        # (the rest is read once it ends: the file's size changes then).
        lines, _ = jsonl.read(path)
        records = [WorkRecord.model_validate_json(line) for line in lines]
        self._cache[path] = ((stat.st_size, stat.st_mtime_ns), records)
        return records

    def load_params(self, step: int) -> dict[str, torch.Tensor] | None:
        """The parameters step STEP started from, or None: not kept, or a file that is
        not a state of named tensors (a keeper's file is checked against the step's
        claims by whoever loads it)."""
        try:
            data = _read(self.layout.params(step), self._max_file_bytes)
            return params_from(data) if data is not None else None
        except UnreadableFile:
            return None

    def load_reveal(self, worker: str, step: int) -> list[torch.Tensor] | None:
        """What WORKER revealed for STEP, or None if it kept nothing. A file that is not a
        list of tensors raises `UnreadableFile`: its writer's broken commitment."""
        try:
            data = _read(self.layout.reveal(worker, step), self._max_file_bytes)
            return reveal_from(data) if data is not None else None
        except UnreadableFile as error:
            raise UnreadableFile(f"{worker}'s file for step {step}: {error}") from None

    def load_local(self, worker: str, step: int) -> tuple[dict, dict] | None:
        """(parameters, optimizer state) of WORKER's step under DiLoCo, or None if it kept
        nothing. A file that is not a kept state raises `UnreadableFile`."""
        try:
            data = _read(self.layout.local(worker, step), self._max_file_bytes)
            return local_from(data) if data is not None else None
        except UnreadableFile as error:
            raise UnreadableFile(f"{worker}'s state for step {step}: {error}") from None


def _read(path: Path, limit: int | None) -> bytes | None:
    """The file's bytes, None if there is none, `UnreadableFile` past `limit` (read no
    further: the file may grow while it is read)."""
    try:
        with path.open("rb") as file:
            if limit is None:
                data = file.read()
            else:  # sized by the file (read(n) sets n bytes aside first), capped by limit
                data = file.read(min(os.fstat(file.fileno()).st_size, limit) + 1)
    except FileNotFoundError:
        return None
    if limit is not None and len(data) > limit:
        raise UnreadableFile(f"{path.name} holds more than {limit} bytes, more than any "
                             "kept file of this job's model")
    return data


def _write_atomic(data: bytes, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
