"""Share balancing converges to equal own-times per step, fixed per-step costs
included, so a slow device with a costly optimizer step does not hold up
every step (the balance point that bench/het.py measures against)."""

from __future__ import annotations

import time

from shoal.spec.elastic import BatchPolicy
from shoal.train.shares import ShareBalancer


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
        weights = balancers[0].proposal(board, members, step) or weights
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
