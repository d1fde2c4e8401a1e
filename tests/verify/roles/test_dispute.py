"""Bisection disputes over a worker's epoch, on synthetic records: the dispute
lands on the first step the challenger rejects, the referee replays that one
step only, and whoever claimed wrongly loses."""

from __future__ import annotations

import pytest

from shoal.verify.roles.dispute import bisect_trajectories, trajectory
from shoal.spec.proof import Verdict, VerdictKind, WorkRecord

H = "ab" * 32


def _records(n: int) -> list[WorkRecord]:
    return [WorkRecord(job="j", step=s, worker="w1", params_sha256=H, positions_start=4 * s,
                       positions_end=4 * s + 2, rank=0, shares=(2, 2), seed=0, global_batch=4,
                       hyper_sha256=H, contribution_sha256=f"{s:064x}", contribution_norm=1.0,
                       rng_seed=s) for s in range(n)]


def bisect_dispute(root, records, challenger, referee):
    """A challenger that replays every record and claims the trajectory its replays give."""
    return bisect_trajectories(root, records, trajectory(root, records, challenger), referee)


def _referee(bad: set[int], replays: list[int]):
    def judge(record: WorkRecord) -> Verdict:
        replays.append(record.step)
        kind = VerdictKind.wrong_contribution if record.step in bad else VerdictKind.valid
        return Verdict(job="j", epoch=0, step=record.step, worker=record.worker, kind=kind)
    return judge


@pytest.mark.parametrize("n", [1, 2, 7, 25, 64])
def test_an_honest_challenger_pins_the_first_bad_step_with_one_replay(n):
    for first_bad in range(n):
        bad = set(range(first_bad, n, 3))
        replays: list[int] = []
        result = bisect_dispute(b"r" * 32, _records(n), lambda r: r.step not in bad,
                                _referee(bad, replays))
        assert result.upheld and result.step == first_bad
        assert replays == [first_bad]
        assert result.rounds <= max(1, (n - 1).bit_length())


@pytest.mark.parametrize("accused", [0, 3, 9])
def test_a_false_accuser_loses_wherever_it_points(accused):
    replays: list[int] = []
    result = bisect_dispute(b"r" * 32, _records(10), lambda r: r.step != accused,
                            _referee(set(), replays))
    assert not result.upheld and result.step == accused and replays == [accused]


def test_no_dispute_when_the_challenger_accepts_everything():
    replays: list[int] = []
    result = bisect_dispute(b"r" * 32, _records(5), lambda r: True, _referee({2}, replays))
    assert not result.upheld and result.step is None and replays == []


def test_trajectories_agree_until_the_first_rejection():
    records = _records(6)
    claimed = trajectory(b"r" * 32, records, lambda r: True)
    challenged = trajectory(b"r" * 32, records, lambda r: r.step != 4)
    assert claimed[:5] == challenged[:5] and all(a != b for a, b in zip(claimed[5:], challenged[5:]))
