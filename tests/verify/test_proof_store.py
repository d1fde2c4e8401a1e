"""The challenge window on a worker's disk: a step's files go only once they are
both `keep_epochs` epochs and `keep_s` seconds old, so a fast job cannot prune
what a verifier has not had time to ask for (the files then read `unavailable`,
and an audit that cannot replay lets a cheat pass)."""

from __future__ import annotations

import os
import time

import torch

from shoal.verify.proof_store import ProofStore


def _store(tmp_path, steps: range) -> ProofStore:
    store = ProofStore(tmp_path)
    for step in steps:
        store.save_reveal("w0", step, [torch.full((3,), float(step))])
        store.save_params(step, {"w": torch.zeros(2)})
    return store


def _age(store: ProofStore, steps: range, seconds: float) -> None:
    then = time.time() - seconds
    for step in steps:
        for path in (store.layout.reveal("w0", step), store.layout.params(step)):
            os.utime(path, (then, then))


def test_files_younger_than_the_window_outlive_their_epochs(tmp_path):
    store = _store(tmp_path, range(10))
    store.prune("w0", keep_from_step=5, keep_s=60.0)
    assert all(store.load_reveal("w0", s) is not None for s in range(10))
    _age(store, range(3), 61.0)
    store.prune("w0", keep_from_step=5, keep_s=60.0)
    assert [s for s in range(10) if store.load_reveal("w0", s) is None] == [0, 1, 2]
    assert [s for s in range(10) if store.load_params(s) is None] == [0, 1, 2]
    # Old enough, but still inside the epochs kept: stays.
    _age(store, range(3, 10), 61.0)
    store.prune("w0", keep_from_step=5, keep_s=60.0)
    assert [s for s in range(10) if store.load_reveal("w0", s) is not None] == [5, 6, 7, 8, 9]


def test_a_window_of_no_seconds_prunes_by_epochs_alone(tmp_path):
    store = _store(tmp_path, range(6))
    store.prune("w0", keep_from_step=4, keep_s=0.0)
    assert [s for s in range(6) if store.load_reveal("w0", s) is not None] == [4, 5]



def test_a_record_being_appended_is_not_read_until_its_line_ends(tmp_path):
    """A peer (the `copy` adversary reads its peers' newest record; a verifier may read a
    running job's files) reads a records file while its worker appends to it: the half
    written last line is not a record yet, not a crash, and it is read once it ends."""
    from tests.proof.factory import record

    writer, reader = ProofStore(tmp_path), ProofStore(tmp_path)
    writer.append_record(record(0, "w0"))
    line = record(1, "w0").model_dump_json() + "\n"
    path = writer.layout.records("w0")
    with path.open("a") as out:
        out.write(line[:40])
    assert [r.step for r in reader.records("w0")] == [0]
    with path.open("a") as out:
        out.write(line[40:])
    assert [r.step for r in reader.records("w0")] == [0, 1]
