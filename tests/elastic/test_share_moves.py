"""Share moves held to the host's clock (issue 40, point 6), tried as a member that
reports a speed it does not have. Simulated steps: each takes as long as its slowest
member needs for its share (plus a fixed exchange), with 1% noise; every 20 steps the
members' reports propose new weights, as the step decider asks at a rebalance point."""

from __future__ import annotations

import random
import statistics

import pytest

from shoal.elastic.share_moves import EpochSteps, ShareMoves, bounded
from shoal.train.shares import moved_weights

BATCH, EXCHANGE_S, INTERVAL = 240, 0.02, 20
MEMBERS = ("a", "b", "c")


def run(true_speeds, reported, steps=600, moves: ShareMoves | None = None, seed=0,
        slow_from: tuple[int, int, float] | None = None):
    """Step times of a job of len(true_speeds) members. `reported(step, speeds)`: what the
    members report (honest: their true speeds). `moves`: the host's check (None: shares
    follow every report, as before). `slow_from`: (step, member, factor) a device slows."""
    rng = random.Random(seed)
    speeds = list(true_speeds)
    weights = (1.0,) * len(speeds)
    history, t, epoch = [], 0.0, EpochSteps()
    for step in range(steps):
        if slow_from and step == slow_from[0]:
            speeds[slow_from[1]] /= slow_from[2]
        total = sum(weights)
        took = max(w / total * BATCH / s for w, s in zip(weights, speeds)) + EXCHANGE_S
        took *= 1 + rng.uniform(-0.01, 0.01)
        t += took
        history.append(took)
        new = None
        if (step + 1) % INTERVAL == 0:
            proposed = moved_weights(reported(step, speeds), weights)
            new = proposed if moves is None else moves.due(epoch, MEMBERS[:len(speeds)],
                                                           weights, proposed)
        epoch.committed(t, step, new is not None)
        weights = new or weights
    return history, weights


def honest(step, speeds):
    return list(speeds)


def liar(factor, member=2):
    def reports(step, speeds):
        out = list(speeds)
        out[member] *= factor
        return out
    return reports


@pytest.mark.parametrize("factor", [3.0, 10.0, 100.0])
def test_a_member_claiming_more_speed_than_it_has_holds_the_job_up_once_then_not(factor):
    """Before: shares followed the claim, and every step waited for the claimant's share
    (10x: steps ~5x longer, for the rest of the job). Now the move is undone at the next
    rebalance point, and the claim, repeated, is tried ever more rarely."""
    speeds = [100.0, 100.0, 100.0]
    fair, _ = run(speeds, honest)
    before, before_weights = run(speeds, liar(factor))
    moves = ShareMoves()
    after, after_weights = run(speeds, liar(factor), moves=moves)
    fair_s, before_s, after_s = (statistics.mean(h[INTERVAL:]) for h in (fair, before, after))
    assert before_s > 1.5 * fair_s  # the attack works on shares that follow any report
    assert before_weights[2] / sum(before_weights) > 0.5
    assert after_s < 1.1 * fair_s  # one interval 1.5x slower each time it is tried
    assert after_weights == (1.0, 1.0, 1.0)  # the claim did not stand
    assert 2 <= moves.undone <= 5  # tried at steps 20, 80, 200, 440: undone each time
    # The speed its offer is held to: the one its share stood at, on its peers' scale.
    assert moves.refuted == {"c"}
    reported = dict(zip(MEMBERS, liar(factor)(0, speeds)))
    published = moves.published(dict(zip(MEMBERS, after_weights)), reported)
    assert published == {"a": 100.0, "b": 100.0, "c": 100.0}


def test_a_device_that_really_slows_down_gets_a_smaller_share_and_keeps_it():
    """The move a report asks for when a member truly slows (its own measure, honest):
    the steps after it are faster, so it stands."""
    moves = ShareMoves()
    history, weights = run([100.0, 100.0, 100.0], honest, moves=moves, slow_from=(100, 2, 2.0))
    assert moves.undone == 0 and not moves.refuted
    assert weights[2] / sum(weights) == pytest.approx(0.2, abs=0.01)  # 50 of 250 samples/s
    balanced = BATCH / 250 + EXCHANGE_S
    assert statistics.median(history[-100:]) == pytest.approx(balanced, rel=0.03)


def test_uneven_devices_reach_their_balance_from_equal_shares():
    moves = ShareMoves()
    history, weights = run([40.0, 80.0, 120.0], honest, moves=moves)
    assert moves.undone == 0
    assert [round(w / sum(weights), 3) for w in weights] == [0.167, 0.333, 0.5]
    assert statistics.median(history[-100:]) == pytest.approx(BATCH / 240 + EXCHANGE_S, rel=0.03)


def test_a_move_is_judged_only_on_enough_steps_each_side():
    moves, epoch = ShareMoves(), EpochSteps()
    epoch.committed(0.0, 0, False)
    epoch.committed(1.0, 1, False)  # one step time: too few to hold a move to
    pair = ("a", "b")
    assert moves.due(epoch, pair, (1.0, 1.0), (1.0, 3.0)) is None
    for step in range(2, 6):
        epoch.committed(float(step), step, False)
    assert moves.due(epoch, pair, (1.0, 1.0), (1.0, 2.0)) == (1.0, 2.0)  # on trial
    epoch.committed(6.0, 6, True)
    epoch.committed(8.0, 7, False)  # slower since, but one step time: not judged yet
    assert moves.due(epoch, pair, (1.0, 2.0), None) is None and epoch.trial is not None
    for step in range(8, 11):
        epoch.committed(8.0 + 2 * (step - 7), step, False)
    assert moves.due(epoch, pair, (1.0, 2.0), (1.0, 4.0)) == (1.0, 1.0)  # undone
    assert moves.undone == 1 and epoch.trial is None and moves.refuted == {"b"}


def test_one_move_grows_a_share_by_at_most_half():
    assert bounded((1.0, 1.0), (1.0, 4.0)) == pytest.approx((1.25, 3.75))  # 4/5 asked: 3/4
    assert bounded((1.0, 1.0), (2.0, 3.0)) == (2.0, 3.0)  # 1/2 -> 3/5: within bound
