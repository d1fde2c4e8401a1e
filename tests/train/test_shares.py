"""Share balancing converges to equal own-times per step, fixed per-step costs
included, so a slow device with a costly optimizer step does not hold up
every step (the balance point that bench/het.py measures against)."""

from __future__ import annotations

import time

from shoal.spec.elastic import BatchPolicy
from shoal.train.shares import ShareBalancer, moved_weights


class _Speeds:
    """The rendezvous's speed board, in memory."""

    def __init__(self) -> None:
        self.board: dict[str, float] = {}

    def report_speed(self, worker: str, speed: float) -> None:
        self.board[worker] = speed

    def speeds(self, members):
        return [self.board.get(m) for m in members]


def _own_times(rates, fixed_s, rounds):
    """Simulate `rounds` rebalances of 4 workers: worker i computes `rates[i]` samples/s
    and spends `fixed_s[i]` applying each step. Returns the last shares and own-times."""
    board, members = _Speeds(), tuple(f"w{i}" for i in range(len(rates)))
    balancers = [ShareBalancer(m, rebalance_interval=1, report_interval=1, slowdown=1.0)
                 for m in members]
    weights = (1.0,) * len(rates)
    for step in range(rounds):
        for b in balancers:
            b.weights = weights
        shares = balancers[0].shares(256, len(rates), BatchPolicy.invariant)
        for b, share, rate, fixed in zip(balancers, shares, rates, fixed_s):
            b.after_apply(fixed)
            b.after_compute(board, share, time.time() - share / rate, step)
        # What the authority does when a ballot says new weights are due.
        if balancers[0].rebalance_due(step):
            weights = moved_weights(board.speeds(members), weights) or weights
    own = [s / r + f for s, r, f in zip(shares, rates, fixed_s)]
    return shares, own


def test_fixed_costs_are_counted_so_own_times_even_out():
    rates, fixed = [40.0, 40.0, 20.0, 10.0], [0.05, 0.05, 0.1, 0.4]
    shares, own = _own_times(rates, fixed, rounds=30)
    assert sum(shares) == 256
    assert max(own) / min(own) < 1.05, (shares, own)
    # Compute speed alone would give the slowest worker 256/11 = 23 samples: 2.7 s of
    # its time against ~2.3 s for the others. Counting its 0.4 s apply, it gets fewer.
    assert shares[3] < 23


def test_a_round_voted_once_says_weights_are_due_when_the_interval_ends_inside_it():
    """DiLoCo votes once per round: with rounds of 7 steps and an interval of 10, the
    outer steps at 6, 13, 20 close steps 0-6, 7-13, 14-20, of which the last two hold
    an interval's end (steps 9 and 19)."""
    balancer = ShareBalancer("w0", rebalance_interval=10, report_interval=1, slowdown=1.0)
    due = [step for step in (6, 13, 20) if balancer.rebalance_due(step, span=7)]
    assert due == [13, 20]
    assert balancer.rebalance_due(19) and not balancer.rebalance_due(13)
    off = ShareBalancer("w0", rebalance_interval=0, report_interval=1, slowdown=1.0)
    assert not any(off.rebalance_due(step) for step in range(30))


def test_new_weights_only_once_every_member_has_a_speed_and_they_moved():
    assert moved_weights([100.0, None], (1.0, 1.0)) is None
    assert moved_weights([100.0, 50.0], (1.0, 1.0)) == (100.0, 50.0)
    assert moved_weights([100.0, 50.5], (2.0, 1.0)) is None  # within the dead band
    assert moved_weights([100.0, 50.0], (1.0, 1.0, 1.0)) is None  # not this membership


def test_with_rebalancing_off_a_new_epoch_keeps_shares_equal():
    """The authority forms every epoch with weights from measured speeds; a job that
    turned rebalancing off keeps equal shares anyway, at every epoch."""
    off = ShareBalancer("w0", rebalance_interval=0, report_interval=1, slowdown=1.0)
    off.enter_epoch((4.0, 1.0, 1.0))
    assert off.shares(12, 3, BatchPolicy.invariant) == (4, 4, 4)
    on = ShareBalancer("w0", rebalance_interval=20, report_interval=1, slowdown=1.0)
    on.enter_epoch((4.0, 1.0, 1.0))
    assert on.shares(12, 3, BatchPolicy.invariant) == (8, 2, 2)
