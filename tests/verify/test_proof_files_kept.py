"""A worker under an agent keeps every step's challenge files (`--keep-proof-files`):
the window is the coordinator's, and a worker pruning on its own clock could be
challenged for a file it had dropped, and be slashed for withholding it."""

from __future__ import annotations

import os
import subprocess

import pytest

from shoal.proof.layout import TENSORS, step_of
from tests.conftest import shoal_command
from tests.verify.roles.conftest import write_proven_job

STEPS, EPOCH_STEPS = 8, 2


def _run(tmp_path, *flags: str) -> dict[str, list[int]]:
    path = write_proven_job(tmp_path, steps=STEPS, epoch_steps=EPOCH_STEPS)
    # The tightest window a worker could prune to: one epoch, no seconds.
    path.write_text(path.read_text().replace("keep_epochs = 1000\nkeep_s = 3600",
                                                       "keep_epochs = 1\nkeep_s = 0"))
    done = subprocess.run(shoal_command("train", str(path), "--workers", "2", "--run-dir",
                                        str(tmp_path / "run"), *flags),
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    proof = tmp_path / "proof"
    return {kind: sorted({step_of(p) for p in (proof / kind).rglob(f"*{TENSORS}")})
            for kind in ("reveal", "params")}


@pytest.mark.slow
def test_a_worker_told_to_keep_its_proof_files_prunes_none(tmp_path):
    assert _run(tmp_path / "kept", "--keep-proof-files") == \
        {"reveal": list(range(STEPS)), "params": list(range(STEPS))}
    # Left to itself, the same worker keeps its newest epoch only.
    alone = _run(tmp_path / "alone")
    assert alone["reveal"] == list(range(STEPS - EPOCH_STEPS, STEPS))
