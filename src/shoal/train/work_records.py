"""A worker's side of proof of learning: for every step it commits, a work
record (what it started from, on which samples, with which seeds and
settings, and a commitment to what it sent), the contribution itself for
the challenge window, and (one worker per job) the parameters each step
started from, so that a verifier can replay any recorded step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from shoal.proof.epochs import params_keepers
from shoal.spec.proof import ProofSpec, WorkRecord
from shoal.train.hashing import param_sha256
from shoal.train.proof_store import ProofStore, contribution_norm, contribution_sha256


@dataclass(frozen=True)
class ProofSettings:
    """What a run records for, from the job (see `Run.prove`)."""

    job: str
    spec: ProofSpec
    directory: str
    hyper_sha256: str
    seed: int
    micro_batch: int | None


def step_rng_seed(seed: int, step: int, positions_start: int) -> int:
    """The seed of a step's own randomness (dropout): fixed by the job, so a worker
    cannot pick a favourable one and a replay uses the same."""
    digest = hashlib.sha256(f"shoal-rng:{seed}:{step}:{positions_start}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


class WorkRecorder:
    def __init__(self, settings: ProofSettings, worker: str) -> None:
        self.settings, self.worker = settings, worker
        self.store = ProofStore(settings.directory)
        self._pending: WorkRecord | None = None
        self._sent: list[torch.Tensor] | None = None

    def begin(self, step: int, model: torch.nn.Module, positions: range, rank: int,
              shares: tuple[int, ...]) -> int:
        """At a step's start: note what it starts from; returns the step's RNG seed.
        The step's two keepers also keep the parameters it starts from, for replays."""
        self._step, self._positions, self._rank, self._shares = step, positions, rank, shares
        self._params_sha256 = param_sha256(model)
        if rank in params_keepers(step, len(shares)):
            self.store.save_params(step, model.state_dict())
        self._rng_seed = step_rng_seed(self.settings.seed, step, positions.start)
        self._pending, self._sent = None, None
        return self._rng_seed

    def seal(self, sent: list[torch.Tensor]) -> WorkRecord:
        """Commit to what this worker is about to send for the step."""
        s = self.settings
        self._pending = WorkRecord(
            job=s.job, step=self._step, worker=self.worker, params_sha256=self._params_sha256,
            positions_start=self._positions.start, positions_end=self._positions.stop,
            rank=self._rank, shares=self._shares, seed=s.seed, global_batch=sum(self._shares),
            micro_batch=s.micro_batch,
            hyper_sha256=s.hyper_sha256,
            contribution_sha256=contribution_sha256(s.job, self.worker, self._step, sent),
            contribution_norm=contribution_norm(sent), rng_seed=self._rng_seed)
        self._sent = [t.detach().clone() for t in sent]
        return self._pending

    def publish(self, record: WorkRecord, reveal: list[torch.Tensor]) -> None:
        """The step committed: publish its record, keep the contribution for audits."""
        self.store.append_record(record)
        self.store.save_reveal(self.worker, record.step, reveal)
        spec = self.settings.spec
        epoch = record.step // spec.epoch_steps
        self.store.prune(self.worker, (epoch - spec.keep_epochs + 1) * spec.epoch_steps,
                         keep_s=spec.keep_s)

    @property
    def pending(self) -> tuple[WorkRecord, list[torch.Tensor]] | None:
        if self._pending is None or self._sent is None:
            return None
        return self._pending, self._sent

    def peer_record(self) -> WorkRecord | None:
        """The newest record of another worker (what a copying cheat would read)."""
        newest = None
        for worker in self.store.workers():
            if worker == self.worker:
                continue
            records = self.store.records(worker)
            if records and (newest is None or records[-1].step > newest.step):
                newest = records[-1]
        return newest
