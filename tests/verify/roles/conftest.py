"""A real job with work records: `shoal train --workers N` with proof enabled,
some workers told to cheat, and the verifier's view of what it left."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from shoal.coordinator.proofs.published_epochs import PublishedEpochs
from shoal.models.gpt_replay import gpt_replayer
from shoal.spec import JobSpec, hyper_digest, load_job
from shoal.verify.audit.record import Auditor
from shoal.spec.proof import WorkRecord
from shoal.verify.proof_store import ProofStore
from tests.conftest import shoal_command, tiny_job_toml
from tests.ledger.conftest import embedded_chain  # noqa: F401  (the trust flow settles on it)


@dataclass
class ProvenJob:
    job: JobSpec
    store: ProofStore

    def auditor(self, source=None, verifier: str = "") -> Auditor:
        return Auditor(source or self.store, gpt_replayer(self.job),
                       hyper_sha256=hyper_digest(self.job.hyperparameters()),
                       tolerance=self.job.proof.tolerance, verifier=verifier)


def write_proven_job(tmp_path: Path, *, steps: int, epoch_steps: int,
                     global_batch: int = 12, sync: str = "", top: str = "") -> Path:
    """`sync`: a [sync] section's body (DiLoCo jobs), else every-step all-reduce;
    `top`: top-level keys (an aggregation rule)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    text = top + tiny_job_toml(tmp_path / "ckpt", interval_steps=1000, steps=steps,
                               global_batch=global_batch)
    # Every file kept to the end: by the workers, and through a coordinator's window.
    text += (f'[proof]\nenabled = true\nepoch_steps = {epoch_steps}\nkeep_epochs = 1000\n'
             'keep_s = 3600\n'
             f'dir = "{tmp_path / "proof"}"\n')
    if sync:
        text += f"[sync]\n{sync}\n"
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def run_proven_job(tmp_path: Path, *, workers: int, steps: int, epoch_steps: int,
                   adversaries: dict[int, str] | None = None, threads: int = 1,
                   global_batch: int = 12, sync: str = "", top: str = "",
                   env: dict[str, str] | None = None, flags: tuple[str, ...] = ()) -> ProvenJob:
    path = write_proven_job(tmp_path, steps=steps, epoch_steps=epoch_steps,
                            global_batch=global_batch, sync=sync, top=top)
    proof_dir = tmp_path / "proof"
    flags = [*flags, *(f"--adversary={i}={name}" for i, name in (adversaries or {}).items())]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **(env or {})}
    done = subprocess.run(shoal_command("train", str(path), "--workers", str(workers),
                                        "--run-dir", str(tmp_path / "run"), *flags),
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return ProvenJob(load_job(path), ProofStore(proof_dir))


def run_members(run_dir: Path):
    """The membership epochs a run's host published (epochs.jsonl), as a verifier's
    `members` (names the workers of shares filed without a record)."""
    published = PublishedEpochs(lambda _: run_dir)
    return lambda epoch: published.members("", epoch)


def rewrite_record(store: ProofStore, record: WorkRecord) -> None:
    """Replace `record`'s worker's record of its step in `store` with `record` (a forger's
    hand on the files it writes)."""
    path = store.layout.records(record.worker)
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = [record.model_dump(mode="json") if (d["step"], d["worker"]) == (record.step, record.worker)
             else d for d in lines]
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
