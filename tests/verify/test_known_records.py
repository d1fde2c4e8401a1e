"""The index a DiLoCo audit reads the job's records through answers as the passes over
every record did, and is built again whenever the records it is given are not the same."""

from __future__ import annotations

from shoal.spec.proof import LocalStep, WorkRecord
from shoal.verify.known_records import KnownRecords


def _record(step: int, worker: str, start: str, end: str) -> WorkRecord:
    local = LocalStep(round_start=0, state_sha256=start, applied=True, end_params_sha256=end,
                      end_state_sha256=end)
    return WorkRecord(job="j", step=step, worker=worker, params_sha256=start, positions_start=0,
                      positions_end=1, rank=0, shares=(1,), seed=0, global_batch=1,
                      hyper_sha256="0" * 64, contribution_sha256="0" * 64,
                      contribution_norm=1.0, rng_seed=0, local=local)


A, B, C = "a" * 64, "b" * 64, "c" * 64
RECORDS = [_record(0, "w0", A, B), _record(0, "w1", A, C), _record(1, "w0", B, C),
           _record(1, "w1", C, C)]


def test_it_answers_as_a_pass_over_every_record():
    known = KnownRecords(RECORDS)
    assert list(known) == RECORDS and len(known) == 4
    for step in (0, 1, 2):
        assert known.of_step(step) == [r for r in RECORDS if r.step == step]
    assert known.of_worker("w1") == [r for r in RECORDS if r.worker == "w1"]
    assert known.ending_at(C) == [r for r in RECORDS if r.local.end_state_sha256 == C]
    assert known.starting_from(A, C) == (2, 1) and known.starting_from(None, B) == (0, 1)
    known.of_step(0).clear()  # an answer is the caller's copy
    assert len(known.of_step(0)) == 2


def test_it_is_kept_for_the_same_records_and_built_again_for_others():
    known = KnownRecords(RECORDS)
    assert KnownRecords.of(list(RECORDS), known) is known  # another list, the same records
    refiled = [*RECORDS[:3], RECORDS[3].model_copy(update={"params_sha256": B})]
    again = KnownRecords.of(refiled, known)
    assert again is not known and again.starting_from(B)[0] == 2
    assert KnownRecords.of(RECORDS[:3], known) is not known
