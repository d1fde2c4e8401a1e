"""Whose word says what a worker declared in a step's exchange: a strict majority
of the step's records, row by row, so neither the audited worker's own record nor
a minority of lying peers decides (attacks on the audit's reading)."""

from __future__ import annotations

import torch

from shoal.spec.proof import Exchanged, VerdictKind, WorkRecord
from shoal.verify import sketch as sk
from shoal.verify.audit.sent import loss_problem, sent_problem

SEED = "ab" * 32
TOLERANCE = 1e-3


def _record(rank: int, world: int, exchanged: Exchanged | None) -> WorkRecord:
    return WorkRecord(job="j", step=3, worker=f"w{rank}", params_sha256="0" * 64,
                      positions_start=rank, positions_end=rank + 1, rank=rank,
                      shares=(1,) * world, seed=0, global_batch=world, hyper_sha256="0" * 64,
                      contribution_sha256="0" * 64, contribution_norm=1.0, rng_seed=0,
                      exchanged=exchanged)


def _sketch(t: torch.Tensor):
    return sk.finite(sk.sketch(SEED, [t])[0])


def test_a_cheat_whose_own_record_claims_its_committed_sketch_is_judged_by_its_peers():
    torch.manual_seed(0)
    parts = [torch.randn(100) for _ in range(3)]
    committed, sent = parts[2], parts[2] * 10
    told = Exchanged(seed=SEED, sketches=(_sketch(parts[0]), _sketch(parts[1]), _sketch(sent)))
    claimed = Exchanged(seed=SEED, sketches=(_sketch(parts[0]), _sketch(parts[1]),
                                             _sketch(committed)))
    records = [_record(0, 3, told), _record(1, 3, told), _record(2, 3, claimed)]
    kind, detail, _ = sent_problem(records[2], records, [committed], TOLERANCE)
    assert kind is VerdictKind.wrong_contribution and "not what it committed" in detail
    for honest in records[:2]:
        assert sent_problem(honest, records, [parts[honest.rank]], TOLERANCE) is None


def test_a_lying_minority_cannot_frame_an_honest_worker():
    torch.manual_seed(1)
    parts = [torch.randn(100) for _ in range(4)]
    truth = Exchanged(seed=SEED, sketches=tuple(_sketch(p) for p in parts))
    framed = Exchanged(seed=SEED, sketches=(_sketch(parts[0] * 3), *truth.sketches[1:]))
    records = [_record(0, 4, truth), _record(1, 4, truth), _record(2, 4, truth),
               _record(3, 4, framed)]
    assert sent_problem(records[0], records, [parts[0]], TOLERANCE) is None


def test_with_two_workers_a_contested_row_is_no_verdict_either_way():
    """One against one: the audit cannot tell the liar, so it blames nobody."""
    parts = [torch.ones(10), torch.full((10,), 2.0)]
    truth = Exchanged(seed=SEED, sketches=(_sketch(parts[0]), _sketch(parts[1])))
    lie = Exchanged(seed=SEED, sketches=(_sketch(parts[0] * 5), _sketch(parts[1])))
    records = [_record(0, 2, truth), _record(1, 2, lie)]
    kind, detail, _ = sent_problem(records[0], records, [parts[0]], TOLERANCE)
    assert kind is VerdictKind.unavailable and "disagree" in detail


def test_slightly_different_tellings_of_one_lie_still_make_a_majority():
    """A cheat that tells each peer a value a little off (so no two records are equal)
    is still read as what most of them were told, within the tolerance."""
    torch.manual_seed(2)
    parts = [torch.randn(100) for _ in range(3)]
    committed, sent = parts[2], parts[2] * 10
    told = [Exchanged(seed=SEED, sketches=(_sketch(parts[0]), _sketch(parts[1]),
                                           _sketch(sent * (1 + 1e-6 * i)))) for i in range(2)]
    claimed = Exchanged(seed=SEED, sketches=(*told[0].sketches[:2], _sketch(committed)))
    records = [_record(0, 3, told[0]), _record(1, 3, told[1]), _record(2, 3, claimed)]
    kind, _, _ = sent_problem(records[2], records, [committed], TOLERANCE)
    assert kind is VerdictKind.wrong_contribution


def test_a_step_whose_records_say_nothing_of_the_exchange_is_refused():
    records = [_record(0, 2, None), _record(1, 2, None)]
    kind, _, _ = sent_problem(records[0], records, [torch.ones(3)], TOLERANCE)
    assert kind is VerdictKind.wrong_params


def test_a_count_is_held_to_the_records_claim():
    part = torch.ones(10)
    view = Exchanged(seed=SEED, sketches=(_sketch(part),) * 3, counts=(8, 8, 7))
    records = [_record(r, 3, view) for r in range(3)]
    assert sent_problem(records[0], records, [part], TOLERANCE, count=8) is None
    kind, detail, _ = sent_problem(records[2], records, [part], TOLERANCE, count=8)
    assert kind is VerdictKind.wrong_samples and "count of 7" in detail


def _reported(losses, samples=(8, 8, 8)) -> list[WorkRecord]:
    told = Exchanged(seed=SEED, sketches=((1.0,),) * 3, losses=losses, loss_samples=samples)
    return [_record(rank, 3, told) for rank in range(3)]


def test_a_loss_report_is_held_to_the_replay_of_the_workers_samples():
    """The guard's spike check reads the mean of the reported losses: a cheat reporting
    a small loss could hide a spike, a large one could skip honest steps."""
    records = _reported((16.0, 16.0 * (1 + 1e-5), 1.6))
    assert loss_problem(records[0], records, 16.0, 8, TOLERANCE) is None
    assert loss_problem(records[1], records, 16.0, 8, TOLERANCE) is None  # another CPU's bits
    kind, detail, distance = loss_problem(records[2], records, 16.0, 8, TOLERANCE)
    assert kind is VerdictKind.wrong_loss and "a replay of its samples gives 16" in detail
    assert distance > 0.8


def test_a_loss_report_must_cover_all_of_the_workers_samples_or_none():
    records = _reported((16.0, 0.0, 8.0), samples=(8, 0, 4))
    assert loss_problem(records[1], records, 16.0, 8, TOLERANCE) is None  # it reported none
    kind, detail, _ = loss_problem(records[2], records, 16.0, 8, TOLERANCE)
    assert kind is VerdictKind.wrong_loss and "over 4 samples; it computed 8" in detail


def test_a_loss_that_is_not_finite_passes_only_where_the_replay_is_not_either():
    records = _reported((None, 16.0, 16.0))
    assert loss_problem(records[0], records, float("inf"), 8, TOLERANCE) is None
    kind, _, _ = loss_problem(records[0], records, 16.0, 8, TOLERANCE)
    assert kind is VerdictKind.wrong_loss


def test_a_cheats_own_record_cannot_vouch_for_its_loss_report():
    """Its peers were told 1.6; its own record says 16: the majority's word is taken."""
    told = Exchanged(seed=SEED, sketches=((1.0,),) * 3, losses=(16.0, 16.0, 1.6),
                     loss_samples=(8, 8, 8))
    claimed = told.model_copy(update={"losses": (16.0, 16.0, 16.0)})
    records = [_record(0, 3, told), _record(1, 3, told), _record(2, 3, claimed)]
    kind, _, _ = loss_problem(records[2], records, 16.0, 8, TOLERANCE)
    assert kind is VerdictKind.wrong_loss


def test_records_without_loss_reports_are_not_held_to_one():
    records = _reported(None, samples=None)
    assert loss_problem(records[0], records, 16.0, 8, TOLERANCE) is None
    assert records[0].leaf() == records[0].model_copy(update={"exchanged": Exchanged(
        seed=SEED, sketches=((1.0,),) * 3)}).leaf()  # unset, they hash as if absent
