"""Work records a referee can really replay: the job's own tiny GPT, one worker
taking each step's whole batch from the same starting parameters, every
contribution computed by the replayer a verifier uses (shoal.verify.replay),
and some steps cheated by scaling what was sent (committed as sent)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shoal.models.gpt_replay import gpt_replayer
from shoal.spec import JobSpec, hyper_digest
from shoal.spec.proof import Exchanged, WorkRecord
from shoal.verify import sketch as sk
from shoal.train.hashing import param_sha256
from shoal.verify.kept_files import params_bytes, reveal_bytes
from shoal.verify.proof_store import contribution_norm, contribution_sha256
from shoal.verify.work_records import step_rng_seed


@dataclass
class Replayable:
    records: list[WorkRecord]
    reveals: dict[int, bytes]  # step -> the contribution file the worker wrote
    params: bytes  # the parameters every step started from, as a keeper writes them


def replayable(spec: JobSpec, worker: str, steps: range, cheat: set[int] = frozenset(),
               scale: float = 4.0) -> Replayable:
    torch.manual_seed(0)
    replayer = gpt_replayer(spec)
    state = {k: v.clone() for k, v in replayer.model.state_dict().items()}
    params_sha256 = param_sha256(replayer.model)
    batch = spec.global_batch
    records, reveals = [], {}
    for step in steps:
        start = step * batch
        base = WorkRecord(job=spec.name, step=step, worker=worker, params_sha256=params_sha256,
                          positions_start=start, positions_end=start + batch, rank=0,
                          shares=(batch,), seed=spec.seed, global_batch=batch,
                          micro_batch=spec.micro_batch,
                          hyper_sha256=hyper_digest(spec.hyperparameters()),
                          contribution_sha256="0" * 64, contribution_norm=0.0,
                          rng_seed=step_rng_seed(spec.seed, step, start))
        replayer.load(state)
        sent = replayer.contribution(base)
        if step in cheat:
            sent = [t * scale for t in sent]
        seed = sk.sum_seed(sent)  # one worker: the exchanged sum is its own part
        records.append(base.model_copy(update={
            "contribution_sha256": contribution_sha256(spec.name, worker, step, sent),
            "contribution_norm": contribution_norm(sent),
            "exchanged": Exchanged(seed=seed, sketches=(sk.finite(sk.sketch(seed, sent)[0]),))}))
        reveals[step] = reveal_bytes([t.clone() for t in sent])
    return Replayable(records, reveals, params_bytes(state))


def replayable_pair(spec: JobSpec, workers: tuple[str, str], steps: range,
                    poisoned: set[int] = frozenset(), scale: float = 4.0) -> Replayable:
    """Two members splitting each step's batch in half, of which only the first files
    records: the second's part (×`scale` at the `poisoned` steps, declared as sent) is
    known only from the declarations in the first's records."""
    torch.manual_seed(0)
    replayer = gpt_replayer(spec)
    state = {k: v.clone() for k, v in replayer.model.state_dict().items()}
    params_sha256 = param_sha256(replayer.model)
    batch, half = spec.global_batch, spec.global_batch // 2
    records, reveals = [], {}
    for step in steps:
        parts, bases = [], []
        for rank, worker in enumerate(workers):
            start = step * batch + rank * half
            base = WorkRecord(job=spec.name, step=step, worker=worker,
                              params_sha256=params_sha256, positions_start=start,
                              positions_end=start + half, rank=rank, shares=(half, half),
                              seed=spec.seed, global_batch=batch, micro_batch=spec.micro_batch,
                              hyper_sha256=hyper_digest(spec.hyperparameters()),
                              contribution_sha256="0" * 64, contribution_norm=0.0,
                              rng_seed=step_rng_seed(spec.seed, step, start))
            replayer.load(state)
            part = replayer.contribution(base)
            if rank == 1 and step in poisoned:
                part = [t * scale for t in part]
            parts.append(part)
            bases.append(base)
        seed = sk.sum_seed([a + b for a, b in zip(*parts)])
        told = Exchanged(seed=seed, sketches=tuple(sk.finite(sk.sketch(seed, p)[0])
                                                   for p in parts))
        records.append(bases[0].model_copy(update={
            "contribution_sha256": contribution_sha256(spec.name, workers[0], step, parts[0]),
            "contribution_norm": contribution_norm(parts[0]), "exchanged": told}))
        reveals[step] = reveal_bytes([t.clone() for t in parts[0]])
    return Replayable(records, reveals, params_bytes(state))
