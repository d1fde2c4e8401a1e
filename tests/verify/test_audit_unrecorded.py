"""Which shares of a step have no record, who held them, and how a replay of one is
judged against what its worker declared (attacks on the reading: a minority of
peers cannot frame it, a record under another lineage does not shield it)."""

from __future__ import annotations

import torch

from shoal.proof.epochs import final_lineage
from shoal.spec.proof import Exchanged, LocalStep, VerdictKind, WorkRecord
from shoal.verify import sketch as sk
from shoal.verify.audit.unrecorded import (
    UNRECORDED, Unrecorded, judge_unrecorded, stand_in, unrecorded_shares,
)

SEED = "ab" * 32
TOLERANCE = 1e-3
MEMBERS = {0: ("a", "b", "c", "d"), 1: ("a", "b", "c")}


def _record(rank: int, exchanged: Exchanged | None, *, shares=(2, 2, 2, 2), epoch: int = 0,
            worker: str | None = None) -> WorkRecord:
    start = 3 * 8 + sum(shares[:rank])
    return WorkRecord(job="j", step=3, worker=worker or MEMBERS[0][rank], params_sha256="1" * 64,
                      positions_start=start, positions_end=start + shares[rank], rank=rank,
                      shares=shares, seed=7, global_batch=8, micro_batch=2,
                      hyper_sha256="2" * 64, contribution_sha256="0" * 64,
                      contribution_norm=1.0, rng_seed=0, membership_epoch=epoch,
                      exchanged=exchanged)


def _sketch(t: torch.Tensor):
    return sk.finite(sk.sketch(SEED, [t])[0])


def test_a_rank_without_a_record_is_named_from_the_published_membership():
    told = Exchanged(seed=SEED, sketches=((1.0,),) * 4)
    records = [_record(r, told) for r in (0, 1, 3)]
    assert unrecorded_shares(records, MEMBERS.get) == [Unrecorded(3, 2, 0, "c")]
    # Another membership's size is not the step's: nobody is named.
    assert unrecorded_shares(records, lambda epoch: MEMBERS[1]) == [Unrecorded(3, 2, 0, None)]
    assert unrecorded_shares(records, lambda epoch: None)[0].worker is None


def test_a_rank_with_no_samples_owes_no_record():
    told = Exchanged(seed=SEED, sketches=((1.0,),) * 4)
    records = [_record(r, told, shares=(3, 3, 2, 0)) for r in (0, 1, 2)]
    assert unrecorded_shares(records, MEMBERS.get) == []


def test_a_record_filed_under_a_lineage_that_did_not_go_on_does_not_shield_the_share():
    """The cheat files its record under a later membership epoch that nobody else
    committed in: the final lineage is its peers', where its rank has no record."""
    told = Exchanged(seed=SEED, sketches=((1.0,),) * 4)
    records = [_record(r, told) for r in (0, 1, 3)] + [_record(2, told, epoch=5)]
    final = final_lineage(records)
    assert {r.membership_epoch for r in final} == {0}
    assert unrecorded_shares(final, MEMBERS.get) == [Unrecorded(3, 2, 0, "c")]


def test_a_diloco_round_end_is_judged_and_unvoted_steps_are_not():
    """A DiLoCo round's end (a voted step) is judged from the worker's kept states
    (`audit_unrecorded_round`), even for a rank with no sample at that step: every
    member sends its round's work. An inner step, or any step nobody voted on, is not."""
    h = "0" * 64
    local = LocalStep(round_start=0, state_sha256=h, applied=True, end_params_sha256=h,
                      end_state_sha256=h)
    told = Exchanged(seed=SEED, sketches=((1.0,),) * 4)
    diloco = [_record(r, told).model_copy(update={"local": local}) for r in (0, 1, 3)]
    assert unrecorded_shares(diloco, MEMBERS.get) == [Unrecorded(3, 2, 0, "c")]
    inner = [r.model_copy(update={"exchanged": None}) for r in diloco]
    assert unrecorded_shares(inner, MEMBERS.get) == []
    assert unrecorded_shares([_record(r, None) for r in (0, 1, 3)], MEMBERS.get) == []


def test_the_stand_in_reads_the_ranks_slice_with_the_steps_settings():
    told = Exchanged(seed=SEED, sketches=((1.0,),) * 4)
    record = stand_in(Unrecorded(3, 2, 0, "c"), [_record(r, told) for r in (0, 1, 3)])
    assert (record.worker, record.rank, record.positions_start, record.positions_end) == \
        ("c", 2, 28, 30)
    assert (record.params_sha256, record.seed, record.micro_batch, record.global_batch) == \
        ("1" * 64, 7, 2, 8)


def test_a_declaration_is_held_to_the_replay_and_a_lying_minority_cannot_frame_it():
    torch.manual_seed(0)
    parts = [torch.randn(50) for _ in range(4)]
    truth = Exchanged(seed=SEED, sketches=tuple(_sketch(p) for p in parts))
    records = [_record(r, truth) for r in (0, 1, 3)]
    record = stand_in(Unrecorded(3, 2, 0, "c"), records)
    kind, detail, _ = judge_unrecorded(record, records, [parts[2]], 0.0, 0, TOLERANCE)
    assert kind is VerdictKind.valid and detail.startswith(UNRECORDED)
    kind, detail, distance = judge_unrecorded(record, records, [parts[2] / 10], 0.0, 0,
                                              TOLERANCE)
    assert kind is VerdictKind.wrong_contribution and distance > TOLERANCE
    # One peer of three says it declared something else: the majority stands.
    framed = Exchanged(seed=SEED, sketches=(*truth.sketches[:2], _sketch(parts[2] * 9),
                                            truth.sketches[3]))
    records[2] = _record(3, framed)
    kind, _, _ = judge_unrecorded(record, records, [parts[2]], 0.0, 0, TOLERANCE)
    assert kind is VerdictKind.valid
    # Two peers against one: no majority for any row, so nobody is blamed.
    split = [_record(0, truth), _record(1, framed)]
    kind, _, _ = judge_unrecorded(stand_in(Unrecorded(3, 2, 0, "c"), split), split,
                                  [parts[2]], 0.0, 0, TOLERANCE)
    assert kind is VerdictKind.unavailable


def test_a_loss_report_is_held_to_the_replays_loss():
    torch.manual_seed(1)
    parts = [torch.randn(50) for _ in range(4)]
    truth = Exchanged(seed=SEED, sketches=tuple(_sketch(p) for p in parts),
                      losses=(4.0, 4.0, 0.4, 4.0), loss_samples=(2, 2, 2, 2))
    records = [_record(r, truth) for r in (0, 1, 3)]
    record = stand_in(Unrecorded(3, 2, 0, "c"), records)
    kind, detail, _ = judge_unrecorded(record, records, [parts[2]], 4.0, 2, TOLERANCE)
    assert kind is VerdictKind.wrong_loss and detail.startswith(UNRECORDED)
    kind, _, _ = judge_unrecorded(record, records, [parts[2]], 0.4, 2, TOLERANCE)
    assert kind is VerdictKind.valid
