import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.train.order import DataOrder, share_positions, split_shares, step_cursor


def test_each_pass_is_a_permutation():
    order = DataOrder(num_samples=97, seed=3)
    first = order.sample_ids(range(0, 97))
    second = order.sample_ids(range(97, 194))
    assert sorted(first) == list(range(97))
    assert sorted(second) == list(range(97))
    assert not np.array_equal(first, second)  # a new order every pass


def test_order_depends_on_seed_only():
    a = DataOrder(1000, seed=1).sample_ids(range(50))
    b = DataOrder(1000, seed=1).sample_ids(range(50))
    c = DataOrder(1000, seed=2).sample_ids(range(50))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_split_shares_proportional_and_exact():
    assert split_shares(10, 3) == (4, 3, 3)
    assert split_shares(10, [3.0, 1.0]) == (8, 2)  # 7.5/2.5: tie goes to the lower index
    assert split_shares(2, 4) == (1, 1, 0, 0)
    with pytest.raises(ValueError):
        split_shares(8, [0.0, 0.0])


@settings(max_examples=200, deadline=None)
@given(
    global_batch=st.integers(1, 64),
    worlds=st.lists(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=8), min_size=1, max_size=30),
)
def test_no_sample_skipped_or_duplicated_across_membership_changes(global_batch, worlds):
    """Whatever the world and its speeds at each step, the union of shares is the step's batch."""
    order = DataOrder(num_samples=53, seed=11)
    seen = []
    for step, weights in enumerate(worlds):
        shares = split_shares(global_batch, weights)
        assert sum(shares) == global_batch
        cursor = step_cursor(step, global_batch)
        for k in range(len(shares)):
            seen.extend(share_positions(cursor, shares, k))
        assert len(order.step_samples(step, global_batch, shares, 0)) == shares[0]
    assert seen == list(range(len(worlds) * global_batch))


def test_step_samples_is_a_pure_function():
    order = DataOrder(num_samples=500, seed=5)
    shares = split_shares(32, [2.0, 1.0, 1.0])
    whole = order.step_samples(7, 32)
    parts = np.concatenate([order.step_samples(7, 32, shares, k) for k in range(3)])
    assert np.array_equal(whole, parts)


def test_min_share_is_a_floor_not_a_surcharge():
    """A worker a quarter as fast gets a quarter's share, not a floor on top of it
    (which made every step wait for it: eta_het 0.67 in bench/het.py)."""
    assert split_shares(256, [1.0, 1.0, 0.5, 0.25], min_share=16) == (93, 93, 47, 23)
    shares = split_shares(256, [1.0, 1.0, 0.5, 0.01], min_share=16)
    assert shares[3] == 16 and sum(shares) == 256
    assert split_shares(10, [1.0, 0.0, 0.0], min_share=2) == (6, 2, 2)
    assert split_shares(5, [1.0, 1.0, 1.0], min_share=2) == (2, 2, 1)  # the batch cannot allow it
