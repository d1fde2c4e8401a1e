"""A worker's side of proof of learning: for every step it commits, a work
record (what it started from, on which samples, with which seeds and
settings, and a commitment to what it sent), the contribution itself for
the challenge window, and (one worker per job) the parameters each step
started from, so that a verifier can replay any recorded step.

Under DiLoCo a step starts from this worker's own replica, so every worker
also keeps its own parameters and optimizer state at each step's start, and
its record claims where the step ended (`LocalStep`): a verifier replays the
gradient from the kept start, then the optimizer step, and follows the
chain of claims back to the round's agreed start.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shoal.proof.epochs import epoch_of, params_keepers, steps_of
from shoal.spec.proof import Exchanged, LocalStep, ProofSpec, WorkRecord
from shoal.train.hashing import optimizer_state_sha256, param_sha256
from shoal.verify.proof_store import ProofStore, contribution_norm, contribution_sha256


@dataclass(frozen=True)
class ProofSettings:
    """What a run records for, from the job (see `Run.prove`)."""

    job: str
    spec: ProofSpec
    directory: str
    hyper_sha256: str
    seed: int
    micro_batch: int | None


@dataclass(frozen=True)
class LocalSteps:
    """Under DiLoCo: the optimizer each worker steps alone, and where a step's round began."""

    optimizer: torch.optim.Optimizer
    round_start: Callable[[int], int]  # step -> the first step of its round


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
        self.local: LocalSteps | None = None  # set by the run under DiLoCo
        self._end: tuple[str, str, bool] | None = None
        self._outer: tuple[torch.Tensor, int, int] | None = None

    def begin(self, step: int, model: torch.nn.Module, positions: range, rank: int,
              shares: tuple[int, ...]) -> int:
        """At a step's start: note what it starts from; returns the step's RNG seed.
        The step's two keepers also keep the parameters it starts from, for replays."""
        self._step, self._positions, self._rank, self._shares = step, positions, rank, shares
        self._params_sha256 = param_sha256(model)
        local = self.local
        # Under DiLoCo replicas agree only at a round's start (theta_outer).
        agreed = local is None or local.round_start(step) == step
        if agreed and rank in params_keepers(step, len(shares)):
            self.store.save_params(step, model.state_dict())
        if local is not None:
            state = local.optimizer.state_dict()["state"]
            self._round_start = local.round_start(step)
            self._state_sha256 = optimizer_state_sha256(state)
            self.store.save_local(self.worker, step, model.state_dict(), state)
        self._rng_seed = step_rng_seed(self.settings.seed, step, positions.start)
        self._pending, self._sent = None, None
        self._end = self._outer = None
        return self._rng_seed

    def local_stepped(self, model: torch.nn.Module, applied: bool) -> None:
        """Under DiLoCo: the step's optimizer update is done (or was not taken)."""
        assert self.local is not None
        state = self.local.optimizer.state_dict()["state"]
        self._end = (param_sha256(model), optimizer_state_sha256(state), applied)

    def outer(self, sent: torch.Tensor, round_samples: int, round_expected: int) -> None:
        """Under DiLoCo, at the round's last step: the pseudo-gradient this worker sends."""
        self._outer = (sent.detach().clone(), round_samples, round_expected)

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
        """The step committed: keep the contribution for audits, then publish its record
        (in that order: a worker killed between the two leaves a contribution nobody asks
        for, never a record whose contribution is missing, which audits as withheld)."""
        self.store.save_reveal(self.worker, record.step, reveal)
        self.store.append_record(record)
        spec = self.settings.spec
        if not spec.prune:
            return  # kept until the coordinator closes the epoch's window (the agent prunes)
        epoch = epoch_of(record.step, spec.epoch_steps)
        self.store.prune(self.worker, steps_of(epoch - spec.keep_epochs + 1, spec.epoch_steps).start,
                         keep_s=spec.keep_s)

    def exchanged(self, declared: Exchanged | None) -> None:
        """After a voted step's exchange: what its members declared they sent goes in the
        step's record (a DiLoCo inner step exchanges nothing, and its record says none)."""
        if self._pending is not None:
            self._pending = self._pending.model_copy(update={"exchanged": declared})

    def sent_part(self) -> list[torch.Tensor]:
        """What this worker committed to putting in the step's exchange: its contribution,
        or under DiLoCo the round's pseudo-gradient."""
        if self._outer is not None:
            return [self._outer[0]]
        assert self._sent is not None, "seal the step before its exchange"
        return self._sent

    @property
    def pending(self) -> tuple[WorkRecord, list[torch.Tensor]] | None:
        if self._pending is None or self._sent is None:
            return None
        if self.local is None:
            return self._pending, self._sent
        if self._end is None:
            return None  # the step never reached its update: nothing to claim
        end_params, end_state, applied = self._end
        record, sent, update, outer = self._pending, self._sent, {}, {}
        if self._outer is not None:  # the round's end: its pseudo-gradient is committed too
            pseudo, samples, expected = self._outer
            sent = [*sent, pseudo]
            outer = {"round_samples": samples, "round_expected": expected,
                     "outer_norm": contribution_norm([pseudo])}
            update["contribution_sha256"] = contribution_sha256(record.job, record.worker,
                                                                record.step, sent)
        update["local"] = LocalStep(round_start=self._round_start, state_sha256=self._state_sha256,
                                    applied=applied, end_params_sha256=end_params,
                                    end_state_sha256=end_state, **outer)
        return record.model_copy(update=update), sent

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
