"""Attacks on a step's sample accounting: copied samples, samples of other
steps, claims without samples and mismatched settings are named; honest
tilings never are."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.proof import MixedRecords, check_step, uncovered
from tests.proof.factory import GLOBAL_BATCH, digest, honest_step, record


@given(st.lists(st.integers(0, GLOBAL_BATCH), min_size=1, max_size=8), st.integers(0, 1000))
def test_honest_tilings_pass_for_any_share_split(cuts, step):
    # Random cut points split the step's window into shares, some of them empty.
    points = sorted([0, GLOBAL_BATCH, *cuts])
    shares = [b - a for a, b in zip(points, points[1:])]
    records = honest_step(step, shares)
    assert check_step(records) == {}
    assert check_step(records, ranks={r.worker: r.rank for r in records}) == {}
    assert uncovered(records, step, GLOBAL_BATCH) == []


def test_a_copied_slice_names_both_records():
    w0, w1 = honest_step(3, [4, 4])
    thief = w0.model_copy(update={"worker": "thief", "contribution_sha256": digest("t")})
    found = check_step([w0, w1, thief])
    assert set(found) == {"w0", "thief"}  # the records alone cannot tell which one copied
    assert "also claimed by 'thief'" in found["w0"]
    assert "also claimed by 'w0'" in found["thief"]


def test_with_the_membership_a_copier_cannot_frame_the_worker_it_copied():
    w0, w1 = honest_step(3, [4, 4])
    thief = w0.model_copy(update={"worker": "thief", "contribution_sha256": digest("t")})
    assert set(check_step([w0, w1, thief], ranks={"w0": 0, "w1": 1})) == {"thief"}
    # A thief that held a rank (an empty share, here) and copies a fuller slice instead.
    w0, w1, idle = honest_step(3, [4, 4, 0])
    thief = w0.model_copy(update={"worker": idle.worker, "contribution_sha256": digest("t")})
    found = check_step([w0, w1, thief], ranks={"w0": 0, "w1": 1, "w2": 2})
    assert set(found) == {"w2"}
    assert "claims rank 0, but held rank 2" in found["w2"]


def test_a_slice_of_another_rank_is_named():
    w0, w1 = honest_step(0, [4, 4])
    greedy = w1.model_copy(update={"positions_start": 2})  # reads two of w0's samples too
    found = check_step([w0, greedy])
    assert set(found) == {"w1"}  # w0, on its own slice, is not dragged in
    assert "not rank 1's slice [4, 8)" in found["w1"]


def test_samples_of_another_step_are_named():
    records = honest_step(2, [4, 4])
    stale = record(2, "stale", 8, 12)  # step 1's samples: cheaper if already computed
    ahead = records[1].model_copy(update={"worker": "ahead", "positions_start": 20,
                                          "positions_end": 25})  # straddles into step 3
    found = check_step([*records, stale, ahead])
    assert "outside step 2's [16, 24)" in found["stale"]
    assert "outside step 2's [16, 24)" in found["ahead"]
    assert "w1" not in found  # whose samples "ahead" overlaps: not framed


def test_a_claim_without_samples_is_named_and_an_empty_honest_share_is_not():
    records = honest_step(1, [8, 0])
    assert check_step(records) == {}
    lazy = records[1].model_copy(update={"contribution_norm": 3.0})
    backwards = records[0].model_copy(update={"worker": "back", "positions_end": 7})
    found = check_step([records[0], lazy, backwards])
    assert "no samples but a non-zero contribution" in found["w1"]
    assert "run backwards" in found["back"]


@pytest.mark.parametrize("field, value", [
    ("params_sha256", digest("stale params")),  # started from old parameters
    ("hyper_sha256", digest("other lr")),  # trained with other hyperparameters
    ("seed", 8),  # another data permutation: other samples under the same positions
    ("global_batch", 16),  # another window
    ("shares", (1, 3, 2, 2)),  # another split, so its slice moves
])
def test_the_minority_on_shared_settings_is_named(field, value):
    records = honest_step(0, [2, 2, 2, 2])
    cheat = records[1].model_copy(update={field: value})
    found = check_step([records[0], cheat, *records[2:]])
    assert set(found) == {"w1"}
    assert field in found["w1"]


def test_a_majority_of_cheats_is_judged_against_the_jobs_own_values():
    records = honest_step(0, [2, 2, 2, 2])
    bad = digest("forged start")
    sybils = [r.model_copy(update={"params_sha256": bad}) for r in records[1:]]
    assert set(check_step([records[0], *sybils])) == {"w0"}  # the majority alone is fooled
    reference = {"params_sha256": records[0].params_sha256}
    assert set(check_step([records[0], *sybils], reference)) == {"w1", "w2", "w3"}


def test_a_tie_names_both_sides():
    a, b = honest_step(0, [4, 4])
    b = b.model_copy(update={"hyper_sha256": digest("other")})
    found = check_step([a, b])
    assert set(found) == {"w0", "w1"}
    assert "no majority" in found["w0"]


def test_two_records_of_one_worker_are_named():
    a, b = honest_step(0, [4, 4])
    assert "2 records" in check_step([a, b.model_copy(update={"worker": "w0"})])["w0"]


def test_one_step_at_a_time():
    with pytest.raises(MixedRecords):
        check_step([record(0, "w0"), record(1, "w1")])


def test_uncovered_samples_are_reported():
    records = [record(1, "a", 8, 10), record(1, "b", 12, 14)]
    assert uncovered(records, 1, GLOBAL_BATCH) == [(10, 12), (14, 16)]
    assert uncovered([], 1, GLOBAL_BATCH) == [(8, 16)]
