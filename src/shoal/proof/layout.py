"""Where a job's proof material lives under its proof directory: one layout that the
workers who write it, the agent that answers from it, the verifiers and the coordinator
all read paths from, so no two of them can disagree on a name.

    records/WORKER.jsonl                one WorkRecord per committed step
    params/STEP.safetensors             the parameters step STEP started from
    reveal/WORKER/STEP.safetensors      what WORKER contributed to step STEP
    local/WORKER/STEP.safetensors       under DiLoCo: WORKER's own state when STEP started
    anchors/EPOCH.json                  the leaves an anchored root was built from
    verdicts/VERIFIER.jsonl             every verdict a verifier signed for the job
    plants/WORKER/STEP.safetensors      the coordinator's: a forced error's true file

Every WORKER (and VERIFIER) is held to one path component (spec.worker.WORKER_NAME)
here too, whatever checked it before: a name is a path under someone's disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shoal.spec.audit import BlobKind
from shoal.spec.worker import check_worker_name

TENSORS = ".safetensors"  # every kept tensor file; a reader parses it, never unpickles it


@dataclass(frozen=True)
class ProofLayout:
    root: Path  # the job's proof directory

    @property
    def records_dir(self) -> Path:
        return self.root / "records"

    def records(self, worker: str) -> Path:
        return self.records_dir / f"{check_worker_name(worker)}.jsonl"

    def params(self, step: int) -> Path:
        return self.root / BlobKind.params.value / _step_file(step)

    def reveal(self, worker: str, step: int) -> Path:
        return self.root / BlobKind.reveal.value / check_worker_name(worker) / _step_file(step)

    def local(self, worker: str, step: int) -> Path:
        return self.root / BlobKind.local.value / check_worker_name(worker) / _step_file(step)

    def kept(self, kind: BlobKind, worker: str, step: int) -> Path:
        """The file a challenge of `kind` asks for (the step's parameters are no one
        worker's: `worker` is ignored for them)."""
        if kind is BlobKind.params:
            return self.params(step)
        return self.local(worker, step) if kind is BlobKind.local else self.reveal(worker, step)

    def kept_dir(self, kind: BlobKind, worker: str | None = None) -> Path:
        """The folder of one worker's files of `kind` (of everyone's: for parameters, or
        with no `worker`)."""
        folder = self.root / kind.value
        if kind is BlobKind.params or worker is None:
            return folder
        return folder / check_worker_name(worker)

    def anchor(self, epoch: int) -> Path:
        return self.root / "anchors" / f"{epoch:09d}.json"

    @property
    def verdicts_dir(self) -> Path:
        return self.root / "verdicts"

    def verdicts(self, verifier: str) -> Path:
        return self.verdicts_dir / f"{check_worker_name(verifier)}.jsonl"

    def plant(self, worker: str, step: int) -> Path:
        return self.root / "plants" / check_worker_name(worker) / _step_file(step)


def step_of(path: Path) -> int | None:
    """The step a kept tensor file is of, or None for any other file (a temporary one)."""
    stem = path.name.removesuffix(TENSORS)
    return int(stem) if path.name.endswith(TENSORS) and stem.isdigit() else None


def _step_file(step: int) -> str:
    return f"{step:09d}{TENSORS}"
