"""Under DiLoCo, whether a round ended at a step is read from the step's records, not
from the audited worker's claim alone: a worker that called its round's end an inner
step would commit no pseudo-gradient, and what it sent would go unchecked."""

from __future__ import annotations

from shoal.spec.proof import Exchanged, LocalStep, VerdictKind, WorkRecord
from shoal.verify.audit.record import _round_end_problem

H = "0" * 64
TOLD = Exchanged(seed="ab" * 32, sketches=((1.0,), (1.0,), (1.0,)))


def _record(rank: int, outer: bool, exchanged: Exchanged | None) -> WorkRecord:
    local = LocalStep(round_start=0, state_sha256=H, applied=True, end_params_sha256=H,
                      end_state_sha256=H, round_samples=4 if outer else None,
                      round_expected=4 if outer else None)
    return WorkRecord(job="j", step=3, worker=f"w{rank}", params_sha256=H,
                      positions_start=rank, positions_end=rank + 1, rank=rank, shares=(1, 1, 1),
                      seed=0, global_batch=3, hyper_sha256=H, contribution_sha256=H,
                      contribution_norm=1.0, rng_seed=0, local=local, exchanged=exchanged)


def test_a_round_end_claimed_as_an_inner_step_is_wrong_where_its_peers_exchanged():
    records = [_record(0, True, TOLD), _record(1, True, TOLD), _record(2, False, None)]
    kind, detail, _ = _round_end_problem(records[2], records)
    assert kind is VerdictKind.wrong_params and "claims no round ended at step 3" in detail
    assert _round_end_problem(records[0], records) is None


def test_a_round_end_claimed_where_nobody_exchanged_is_wrong():
    records = [_record(0, False, None), _record(1, False, None), _record(2, True, TOLD)]
    kind, detail, _ = _round_end_problem(records[2], records)
    assert kind is VerdictKind.wrong_params and "claims a round ended at step 3" in detail


def test_one_against_one_is_no_verdict_either_way():
    records = [_record(0, True, TOLD), _record(1, False, None)]
    for record in records:
        kind, _, _ = _round_end_problem(record, records)
        assert kind is VerdictKind.unavailable
