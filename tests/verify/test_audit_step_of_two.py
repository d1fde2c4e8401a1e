"""Attacks on an audit's reading of a step from its records, where one record is
as many as all the others: a step of two. A worker chooses its own id (so whether
its record is listed first), the seeds and settings it writes, and the bytes of
the files it keeps. None of that may let it pass a replay it fails, nor make its
honest peer the one found wrong; and a file that does not load convicts its
writer, never stops the verifier.

A linear model on random data stands in for the job's: the rules read records
and files, not the model."""

from __future__ import annotations

import pytest
import torch

from shoal.verify.roles.verifier import Verifier
from shoal.spec.proof import Exchanged, ProofSpec, VerdictKind, WorkRecord, hyper_digest
from shoal.verify import sketch as sk
from shoal.verify.audit.record import Auditor
from shoal.train.hashing import param_sha256
from shoal.train.order import share_positions, step_cursor
from shoal.verify.proof_store import ProofStore, contribution_norm, contribution_sha256
from shoal.verify.replay import JobSeeds, Replayer
from shoal.verify.work_records import step_rng_seed

JOB, HYPER, SEED, BATCH, SHARES, STEP = "j", hyper_digest({"job": 1}), 7, 8, (4, 4), 0
SAMPLES = 64
torch.manual_seed(0)
X, Y = torch.randn(SAMPLES, 4), torch.randn(SAMPLES, 1)
# Either order: the cheat's id sorts before its peer's, or after.
ORDERS = [("a-cheat", "z-honest"), ("z-cheat", "a-honest")]


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Linear(4, 1)


def _loss(model, batch):
    return ((model(batch[0]) - batch[1]) ** 2).mean()


def _fetch(ids):
    ids = torch.as_tensor(ids)
    return X[ids], Y[ids]


def _replayer() -> Replayer:
    return Replayer(_model(), _loss, _fetch, SAMPLES, seeds=JobSeeds(SEED, None))


def _record(rank: int, worker: str, *, seed: int = SEED, **fields) -> WorkRecord:
    at = share_positions(step_cursor(STEP, BATCH), SHARES, rank)
    values = dict(job=JOB, step=STEP, worker=worker, params_sha256="0" * 64,
                  positions_start=at.start, positions_end=at.stop, rank=rank, shares=SHARES,
                  seed=seed, global_batch=BATCH, hyper_sha256=HYPER,
                  contribution_sha256="0" * 64, contribution_norm=1.0,
                  rng_seed=step_rng_seed(seed, STEP, at.start))
    return WorkRecord(**{**values, **fields})


def _honest_part(rank: int, seed: int = SEED) -> list[torch.Tensor]:
    replayer = Replayer(_model(), _loss, _fetch, SAMPLES)
    return replayer.contribution(_record(rank, "x", seed=seed))


def _step(tmp_path, cheat: str, honest: str, *, scale: float = 1.0, cheat_seed: int = SEED,
          cheat_sum_seed: str | None = None, cheat_start: str | None = None):
    """One step of two, the cheat at rank 0: each worker's record and kept part, as the
    run leaves them; the verdicts of auditing every record."""
    store = ProofStore(tmp_path)
    store.save_params(STEP, _model().state_dict())
    start = param_sha256(_model())
    parts = {0: [t * scale for t in _honest_part(0, cheat_seed)], 1: _honest_part(1)}
    total = [a + b for a, b in zip(parts[0], parts[1])]
    sum_seed = sk.sum_seed(total)
    told = Exchanged(seed=sum_seed,
                     sketches=tuple(sk.finite(s) for s in sk.sketch(sum_seed, parts[0], parts[1])))
    for rank, worker in ((0, cheat), (1, honest)):
        is_cheat = worker == cheat
        store.save_reveal(worker, STEP, parts[rank])
        exchanged = told.model_copy(update={"seed": cheat_sum_seed}) \
            if is_cheat and cheat_sum_seed else told
        store.append_record(_record(
            rank, worker, seed=cheat_seed if is_cheat else SEED,
            params_sha256=(cheat_start if is_cheat and cheat_start else start),
            contribution_sha256=contribution_sha256(JOB, worker, STEP, parts[rank]),
            contribution_norm=contribution_norm(parts[rank]), exchanged=exchanged))
    return store


def _verdicts(store: ProofStore) -> dict[str, tuple[VerdictKind, str]]:
    auditor = Auditor(store, _replayer(), hyper_sha256=HYPER, tolerance=1e-3)
    verifier = Verifier(auditor, ProofSpec(enabled=True, epoch_steps=1, audit_rate=1.0),
                        salt=b"step-of-two", total_steps=1)
    audit = verifier.audit_epoch(0, store.records(), every=True)
    return {v.worker: (v.kind, v.detail) for v in audit.verdicts}


@pytest.mark.parametrize("cheat,honest", ORDERS)
def test_a_lie_about_the_exchanged_sum_in_its_own_record_does_not_skip_its_replay(
        tmp_path, cheat, honest):
    """The cheat sends ten times its gradient (committed and declared, so the step adds
    up online) and writes another sum into its own record: one record against one, the
    declarations cannot be read. That must not spare it the replay, which needs none."""
    found = _verdicts(_step(tmp_path, cheat, honest, scale=10.0, cheat_sum_seed="e" * 64))
    assert found[cheat][0] is VerdictKind.wrong_contribution, found
    assert found[honest][0] is VerdictKind.unavailable, found  # not blamed for the split


@pytest.mark.parametrize("cheat,honest", ORDERS)
def test_a_record_with_a_data_seed_of_its_own_is_wrong_and_its_peer_is_not(
        tmp_path, cheat, honest):
    """The cheat trains on an order of its choosing and says so in its record: it chose
    its samples. Listed first, it used to make its honest peer the odd one out."""
    found = _verdicts(_step(tmp_path, cheat, honest, cheat_seed=SEED + 1))
    assert found[cheat][0] is VerdictKind.wrong_params and "data seed" in found[cheat][1]
    assert found[honest][0] is VerdictKind.valid, found


@pytest.mark.parametrize("cheat,honest", ORDERS)
def test_a_forged_start_with_a_snapshot_to_match_frames_nobody(tmp_path, cheat, honest):
    """The cheat claims a start of its own and, as a keeper of the step, serves a
    snapshot that hashes to it: one claim against one. Whichever record is listed
    first, the honest worker is not found wrong (there is no verdict on the step)."""
    forged = {k: v + 1.0 for k, v in _model().state_dict().items()}
    model = _model()
    model.load_state_dict(forged)
    store = _step(tmp_path, cheat, honest, cheat_start=param_sha256(model))
    store.save_params(STEP, forged)
    found = _verdicts(store)
    assert found[honest][0] is VerdictKind.unavailable, found
    assert found[cheat][0] is not VerdictKind.valid, found


def test_a_record_whose_rng_seed_is_not_the_derived_one_is_wrong(tmp_path):
    """The step's RNG seed (dropout masks) is the job's to derive: a worker that picks
    it can grind masks for the update it likes, which then replays bit for bit."""
    store = _step(tmp_path, "a-cheat", "z-honest")
    ground = store.records("a-cheat")[0].model_copy(update={"rng_seed": 12345})
    auditor = Auditor(store, _replayer(), hyper_sha256=HYPER, tolerance=1e-3)
    verifier = Verifier(auditor, ProofSpec(enabled=True, epoch_steps=1, audit_rate=1.0),
                        salt=b"step-of-two", total_steps=1)
    records = [ground, store.records("z-honest")[0]]
    found = {v.worker: v for v in verifier.audit_epoch(0, records, every=True).verdicts}
    assert found["a-cheat"].kind is VerdictKind.wrong_params
    assert "RNG seed" in found["a-cheat"].detail
    assert found["z-honest"].kind is VerdictKind.valid


@pytest.mark.parametrize("garbage", [b"x", b"PK\x03\x04 truncated zip", b""])
def test_a_kept_file_that_does_not_load_convicts_its_writer_and_the_audit_goes_on(
        tmp_path, garbage):
    store = _step(tmp_path, "a-cheat", "z-honest")
    store.layout.reveal("a-cheat", STEP).write_bytes(garbage)
    found = _verdicts(store)
    assert found["a-cheat"][0] is VerdictKind.bad_commitment, found
    assert found["z-honest"][0] is VerdictKind.valid, found

