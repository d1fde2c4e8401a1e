"""A forced error must pass every check cheaper than a replay, or a verifier could
find all plants without replaying: the sketch of what its worker declared in the
step's exchange is the plant's, in every record of the step it is served with."""

from __future__ import annotations

import io

import torch

from shoal.control.coordinator.plant_files import planted_reveal, with_plants
from shoal.spec.proof import Exchanged, VerdictKind, WorkRecord
from shoal.train import sketch as sk
from shoal.train.audit_sent import sent_problem
from shoal.train.proof_store import contribution_norm, contribution_sha256
from tests.control.coordinator.test_forced_errors import worker_file

SEED, TOLERANCE = "cd" * 32, 1e-3


def _step(tmp_path) -> tuple[list[WorkRecord], dict[str, list[torch.Tensor]], dict[str, bytes]]:
    torch.manual_seed(3)
    parts = {f"w{r}": [torch.randn(6, 4), torch.randn(4)] for r in range(3)}
    view = Exchanged(seed=SEED, sketches=tuple(sk.finite(sk.sketch(SEED, parts[f"w{r}"])[0])
                                               for r in range(3)))
    records = [WorkRecord(job="tiny", step=2, worker=w, params_sha256="0" * 64,
                          positions_start=r, positions_end=r + 1, rank=r, shares=(1, 1, 1),
                          seed=0, global_batch=3, hyper_sha256="0" * 64,
                          contribution_sha256=contribution_sha256("tiny", w, 2, parts[w]),
                          contribution_norm=contribution_norm(parts[w]), rng_seed=0,
                          exchanged=view)
               for r, w in enumerate(parts)]
    files = {w: worker_file(parts[w], r, tmp_path) for r, w in enumerate(parts)}
    return records, parts, files


def test_a_plant_passes_the_sketch_check_and_only_a_replay_finds_it(tmp_path):
    records, parts, files = _step(tmp_path)
    plant, blob = planted_reveal(files["w1"], records[1], b"s" * 32, TOLERANCE)
    wrong = torch.load(io.BytesIO(blob), weights_only=True)
    served = with_plants(records, {("w1", 2): plant})
    assert served[1] is not records[1] and served[1].contribution_sha256 == plant.contribution_sha256
    assert sent_problem(served[1], served, wrong, TOLERANCE) is None
    for honest in (served[0], served[2]):  # the plant changes no one else's row
        assert sent_problem(honest, served, parts[honest.worker], TOLERANCE) is None
    # Served without its sketch in the other records, the cheap check would give it away.
    naive = [records[0], plant, records[2]]
    kind, _, _ = sent_problem(plant, naive, wrong, TOLERANCE)
    assert kind is VerdictKind.wrong_contribution
