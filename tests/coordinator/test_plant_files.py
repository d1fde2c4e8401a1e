"""A forced error must pass every check cheaper than a replay, or a verifier could
find all plants without replaying: the sketch of what its worker declared in the
step's exchange is the plant's, in every record of the step it is served with, and
its file is laid out as the worker laid out its own, however that was."""

from __future__ import annotations

import json

import torch

from shoal.coordinator.proofs.plant_files import planted_reveal, with_plants
from shoal.spec.proof import Exchanged, VerdictKind, WorkRecord
from shoal.verify import sketch as sk
from shoal.verify.audit.sent import sent_problem
from shoal.verify.proof_store import contribution_norm, contribution_sha256
from shoal.verify.kept_files import reveal_from
from shoal.verify.replay import relative_distance
from tests.coordinator.test_forced_errors import legacy_worker_file, worker_file

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
    files = {w: worker_file(parts[w]) for w in parts}
    return records, parts, files


def test_a_plant_passes_the_sketch_check_and_only_a_replay_finds_it(tmp_path):
    records, parts, files = _step(tmp_path)
    plant, blob = planted_reveal(files["w1"], records[1], b"s" * 32, TOLERANCE)
    wrong = reveal_from(blob)
    served = with_plants(records, {("w1", 2): plant})
    assert served[1] is not records[1] and served[1].contribution_sha256 == plant.contribution_sha256
    assert sent_problem(served[1], served, wrong, TOLERANCE) is None
    for honest in (served[0], served[2]):  # the plant changes no one else's row
        assert sent_problem(honest, served, parts[honest.worker], TOLERANCE) is None
    # Served without its sketch in the other records, the cheap check would give it away.
    naive = [records[0], plant, records[2]]
    kind, _, _ = sent_problem(plant, naive, wrong, TOLERANCE)
    assert kind is VerdictKind.wrong_contribution


def _header(data: bytes) -> bytes:
    return data[:8 + int.from_bytes(data[:8], "little")]


def test_a_plant_keeps_a_layout_of_the_workers_own_choosing(tmp_path):
    # The parser takes the tensors' data in any order and a padded header: a worker
    # could mark its files so for a colluding verifier, who would then know every
    # file laid out otherwise for a plant.
    records, parts, _ = _step(tmp_path)
    first, second = (t.contiguous().view(torch.uint8).numpy().tobytes() for t in parts["w1"])
    header = {"1": {"dtype": "F32", "shape": [4], "data_offsets": [0, len(second)]},
              "0": {"dtype": "F32", "shape": [6, 4],
                    "data_offsets": [len(second), len(second) + len(first)]}}
    body = json.dumps(header, indent=3).encode()
    body += b" " * (-len(body) % 8 + 64)
    marked = len(body).to_bytes(8, "little") + body + second + first
    assert all(torch.equal(a, b) for a, b in zip(reveal_from(marked), parts["w1"]))
    _, blob = planted_reveal(marked, records[1], b"s" * 32, TOLERANCE)
    assert _header(blob) == _header(marked) and len(blob) == len(marked)
    assert relative_distance(parts["w1"], reveal_from(blob)) > 3 * TOLERANCE


def test_a_worker_file_that_is_a_torch_archive_makes_no_plant(tmp_path):
    """A pickle is no tensor file: nothing is planted from it (its record is served as it
    is, and a verifier's replay calls the file unreadable, its writer's fault)."""
    records, parts, _ = _step(tmp_path)
    old = legacy_worker_file(parts["w1"], 2, tmp_path)
    assert planted_reveal(old, records[1], b"s" * 32, TOLERANCE) is None
