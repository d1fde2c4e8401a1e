"""Which steps share a root: the runtime and the verifier must agree exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.proof import ProofError, by_epoch, epoch_of, is_complete, missing_steps, steps_of
from shoal.proof.epochs import kept_from, window_epoch
from tests.proof.factory import honest_epoch, record


def test_steps_map_to_epochs_and_back():
    for epoch_steps in (1, 3, 25):
        for step in range(100):
            assert step in steps_of(epoch_of(step, epoch_steps), epoch_steps)
    assert list(steps_of(2, 25)) == list(range(50, 75))
    assert list(steps_of(3, 25, total_steps=90)) == list(range(75, 90))  # the job's last epoch
    assert list(steps_of(4, 25, total_steps=90)) == []


def test_bad_arguments_are_refused():
    with pytest.raises(ProofError):
        epoch_of(3, 0)
    with pytest.raises(ProofError):
        epoch_of(-1, 5)


def test_records_group_by_epoch_in_canonical_order():
    records = honest_epoch(range(7), workers=2)
    groups = by_epoch(reversed(records), epoch_steps=3)
    assert sorted(groups) == [0, 1, 2]
    assert [(r.step, r.worker) for r in groups[2]] == [(6, "w0"), (6, "w1")]
    assert len(groups[0]) == 6


def test_an_epoch_is_complete_only_when_every_step_has_records():
    records = honest_epoch(range(5), workers=2)
    assert is_complete(records, 0, epoch_steps=5)
    gap = [r for r in records if r.step != 3]
    assert not is_complete(gap, 0, epoch_steps=5)
    assert missing_steps(gap, 0, epoch_steps=5) == [3]
    assert not is_complete(records, 1, epoch_steps=5)  # nothing of epoch 1 yet
    assert is_complete([record(5, "w0"), record(6, "w0")], 1, epoch_steps=5, total_steps=7)
    assert not is_complete([], 2, epoch_steps=5, total_steps=7)  # past the job's end: no epoch


def test_only_the_newest_lineage_of_a_redone_step_counts():
    from shoal.proof.epochs import final_lineage

    old = [record(5, "a", membership_epoch=2), record(5, "b", membership_epoch=2)]
    redone = [record(5, "c", membership_epoch=4, params_sha256="f" * 64)]
    other = [record(6, "c", membership_epoch=4)]
    assert final_lineage(old + redone + other) == redone + other
    assert final_lineage(old) == old  # nothing redone: everything counts


def test_two_workers_keep_each_steps_parameters_and_the_duty_rotates():
    from shoal.proof.epochs import params_keepers

    assert params_keepers(7, 1) == {0}
    assert params_keepers(7, 2) == {0, 1}
    kept = [params_keepers(step, 4) for step in range(8)]
    assert all(len(k) == 2 for k in kept)
    # Over a cycle every rank keeps the same share, and no rank keeps every step.
    assert {rank: sum(rank in k for k in kept) for rank in range(4)} == {0: 4, 1: 4, 2: 4, 3: 4}
    with pytest.raises(ProofError):
        params_keepers(0, 0)


def _lineage(step: int, epoch: int, shares: tuple[int, ...], ranks: list[int],
             params: str = "a") -> list:
    """The records ranks `ranks` of membership epoch `epoch` file for `step`."""
    from tests.proof.factory import GLOBAL_BATCH

    cursor, out = step * GLOBAL_BATCH, []
    for rank, share in enumerate(shares):
        if rank in ranks:
            out.append(record(step, f"w{rank}", cursor, cursor + share, rank=rank, shares=shares,
                              membership_epoch=epoch, params_sha256=params * 64))
        cursor += share
    return out


def test_a_member_cannot_shadow_a_steps_records_by_claiming_it_for_a_later_epoch():
    """The attack: w1, a member of the later epoch 3, files a record of step 5 (committed
    in epoch 2) naming epoch 3, so that its record would be the step's newest lineage and
    the real records of step 5 (its own cheat among them) would go unaudited. Its new
    record replaces its own old one in the store. However it sets the shares, the
    honest lineage stays final."""
    from shoal.proof.epochs import final_lineage
    from tests.proof.factory import GLOBAL_BATCH as B

    honest = _lineage(5, 2, (B // 4,) * 4, ranks=[0, 2, 3])  # w1's own was replaced
    for shares in [(0, B, 0, 0), (B // 4,) * 4, (1, B - 3, 1, 1)]:
        fake = _lineage(5, 3, shares, ranks=[1], params="f")
        assert final_lineage(honest + fake) == honest, shares
    # Two members: the fake and the one honest record left are one worker each; the
    # older lineage stands.
    pair = _lineage(5, 2, (B // 2,) * 2, ranks=[0])
    assert final_lineage(pair + _lineage(5, 3, (B // 2,) * 2, ranks=[1], params="f")) == pair
    # Colluding with a majority of the later epoch would pass: said in the docstring.


def test_a_redone_step_stays_final_with_a_record_lost():
    """The honest case the rule must keep: a step redone after a restore, one member's
    record of the redo lost with its machine (its old record is then still stored)."""
    from shoal.proof.epochs import final_lineage
    from tests.proof.factory import GLOBAL_BATCH as B

    old = _lineage(5, 2, (B // 4,) * 4, ranks=[3])
    redone = _lineage(5, 4, (B // 4,) * 4, ranks=[0, 1, 2], params="e")
    assert final_lineage(old + redone) == redone
    # A batch smaller than the epoch leaves ranks without a share: still a commit.
    small = _lineage(6, 4, (1, 1, 0), ranks=[0, 1])
    assert final_lineage(_lineage(6, 2, (1, 1, 0), ranks=[0, 1, 2]) + small) == small


@given(epoch_steps=st.integers(1, 30), reach=st.integers(0, 60), total=st.integers(1, 300),
       closed=st.integers(0, 12))
def test_an_agent_keeps_exactly_the_files_whose_window_is_open(epoch_steps, reach, total,
                                                                closed):
    """A step's files go (below `kept_from`) exactly when the window that governs them, that
    of the epoch its last audit is in, is closed: never one a challenge may still ask for."""
    first_kept = kept_from(closed, epoch_steps, reach, total)
    for step in range(total):
        assert (step < first_kept) == (window_epoch(step, epoch_steps, reach, total) < closed)


def test_a_diloco_rounds_files_are_governed_by_the_epoch_it_ends_in():
    # Rounds of 4 steps, epochs of 10: step 8 starts the round that ends at step 11.
    assert window_epoch(8, 10, 3, 100) == 1 and window_epoch(6, 10, 3, 100) == 0
    assert window_epoch(98, 10, 3, 100) == 9  # the job's last step ends every round
    assert kept_from(1, 10, 3, 100) == 7 and kept_from(10, 10, 3, 100) == 100
