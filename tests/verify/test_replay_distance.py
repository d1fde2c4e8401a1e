"""How far a revealed contribution is from its replay, where values are not finite."""

from __future__ import annotations

import torch

from shoal.verify.replay import relative_distance


def test_a_nan_where_the_replay_is_finite_is_infinitely_far():
    replayed = [torch.tensor([1.0, 2.0, 3.0])]
    assert relative_distance(replayed, [torch.tensor([1.0, float("nan"), 3.0])]) == float("inf")


def test_finite_values_where_the_replay_is_nan_are_infinitely_far():
    """Where the honest computation overflows, a cheat cannot send tidy numbers."""
    replayed = [torch.tensor([1.0, float("nan"), 3.0])]
    assert relative_distance(replayed, [torch.tensor([1.0, 0.0, 3.0])]) == float("inf")


def test_nan_where_the_replay_is_nan_is_compared_on_the_rest():
    replayed = [torch.tensor([1.0, float("nan"), 3.0, float("inf")])]
    same = [torch.tensor([1.0, float("nan"), 3.0, float("inf")])]
    assert relative_distance(replayed, same) == 0.0
    off = [torch.tensor([1.0, float("nan"), 4.0, float("inf")])]
    assert abs(relative_distance(replayed, off) - (1 / 10) ** 0.5) < 1e-12
