"""The harness of the market property tests: a seeded chain and the plumbing.

`World` deploys one market and seeds it once per session; every example
reverts to that snapshot. `MarketHarness` sends calls, compares outcomes with
the model, and draws plausible arguments (mostly known jobs and leases).
"""

from __future__ import annotations

import copy
import functools
import time

from hypothesis import event
from hypothesis import strategies as st

from shoal.ledger import Chain, ContractRevert, Ledger
from shoal.spec.ledger import LedgerConfig, TxOutcome
from tests.ledger.conftest import Actors
from tests.ledger.model import Errors, JobM, LeaseM, MarketModel

CONFIG = LedgerConfig(fee_bps=250, whistleblower_bps=4000, min_stake_wei=1000, min_bond_wei=100,
                      unbonding_delay_s=500, silence_timeout_s=1000, dispute_window_s=120)
ACTORS = range(9)  # indexes into Actors.all()
IDS = st.integers(1, 6)  # job and dispute ids: existing ones and ones never made
PROVIDERS = [5, 6, 7, 8]  # the three staked providers and the stranger
WEI = st.one_of(st.just(0), st.integers(1, 5_000), st.integers(10**6, 10**9))
SECONDS = st.integers(0, 400)


class World:
    """One chain and contract for all examples; each starts from the same market.

    The market is seeded with staked providers, two open jobs with leases and
    one settled job, so that short random runs reach every kind of step.
    """

    def __init__(self) -> None:
        self.chain = Chain.embedded()
        self.actors = a = Actors.of(self.chain)
        self.ledger = led = Ledger.deploy(self.chain, a.owner, a.operator.address, a.referee.address, CONFIG)
        m = MarketModel(CONFIG, a.owner.address, a.operator.address, a.referee.address)
        for p in a.providers:
            led.stake(p, 10_000)
            m.stakes[p.address] = 10_000
        for submitter, price, deposit in ((a.submitters[0], 1_000, 10**9), (a.submitters[1], 500, 10**7)):
            out = led.create_job(submitter, price, deposit)
            m.jobs[out.returned] = JobM(submitter.address, price, deposit)
        for job, p, price in ((1, a.providers[0], 1_000), (1, a.providers[1], 300), (2, a.providers[2], 200)):
            led.open_lease(a.operator, job, p.address, price)
            m.leases[(job, p.address)] = LeaseM(price)
        # Job 3 is settled with booked work and past its dispute window, so
        # payouts, claims and withdrawals are possible from the first step.
        out = led.create_job(a.submitters[0], 100, 10**8)
        m.jobs[3] = JobM(a.submitters[0].address, 100, 10**8)
        work = []
        for p, price, seconds in zip(a.providers, (100, 50, 20), (100, 200, 0), strict=True):
            led.open_lease(a.operator, 3, p.address, price)
            m.leases[(3, p.address)] = LeaseM(price)
            work.append((p.address, seconds))
        for job in (1, 3):
            led.anchor(a.operator, job, 0, b"\x07" * 32)
            m.jobs[job].epochs = 1
        led.book(a.operator, 3, 0, dict(work))
        m.apply_book(3, work, 0)
        settled = led.settle(a.operator, 3)
        m.apply_close(3, CONFIG.fee_bps, self.chain.w3.eth.get_block(settled.block)["timestamp"])
        self.chain.advance_time(CONFIG.dispute_window_s + 1)
        for job in (1, 2, 3):
            m.jobs[job].last_active = led.job(job).last_active
        m.touched.clear()
        self.model = m
        self.snapshot = self.chain.snapshot()


@functools.cache
def world() -> World:
    return World()


class MarketHarness:
    """Plumbing shared by the rules; `reset` starts an example from the seeded market."""

    def reset(self) -> None:
        self.w = world()
        self.w.chain.revert(self.w.snapshot)
        self.w.snapshot = self.w.chain.snapshot()
        self.w.ledger.sender.reset()
        self.chain, self.ledger = self.w.chain, self.w.ledger
        self.accounts = self.w.actors.all()
        self.addresses = [x.address for x in self.accounts]
        self.m = copy.deepcopy(self.w.model)
        self.fees = 0
        self.total = self._total()

    def _total(self) -> int:
        return sum(self.chain.balance(x) for x in self.addresses) + self.ledger.balance()

    def _sender(self, honest: bool, index: int, role: str) -> object:
        if honest:
            return self.accounts[self.addresses.index(role)]
        return self.accounts[index]

    def _send(self, errors: Errors, call) -> TxOutcome | None:
        """Run `call`; it must succeed iff `errors` is empty, else fail with one of them."""
        try:
            outcome = call()
        except ContractRevert as error:
            event(f"{error.function} refused: {type(error).__name__}")
            self.fees += error.fee_wei
            assert errors, f"unexpected revert: {error}"
            assert type(error) in errors, f"{error} is not one of {errors}"
            return None
        outcomes = outcome if isinstance(outcome, list) else [outcome]
        event(f"{outcomes[0].function} ok")
        self.fees += sum(o.fee_wei for o in outcomes)
        assert not errors, f"expected one of {errors}, but {outcomes[0].function} succeeded"
        return outcomes[0]

    def _ts(self, outcome: TxOutcome) -> int:
        return int(self.chain.w3.eth.get_block(outcome.block)["timestamp"])

    def _after(self, threshold: int, strict: bool) -> bool | None:
        """Whether the next block's time passes `threshold`; None if too close to tell."""
        latest = self.chain.now()
        low = max(latest + 1, int(time.time()) - 1)
        high = max(latest + 1, int(time.time())) + 10
        passes = [t > threshold if strict else t >= threshold for t in (low, high)]
        return passes[0] if passes[0] == passes[1] else None

    def _job(self, data, settled: bool | None = None) -> int:
        """Mostly a job the model knows (open or settled, as asked), else any id."""
        known = [j for j, m in self.m.jobs.items() if settled is None or bool(m.settled_at) == settled]
        if known and data.draw(st.integers(0, 4), label="known job") > 0:
            return data.draw(st.sampled_from(known), label="job")
        return data.draw(IDS, label="job")

    def _leased(self, data, job: int, max_size: int) -> list[str]:
        """Mostly providers leased on `job` (each once), else any providers."""
        leased = sorted(p for (j, p) in self.m.leases if j == job)
        if leased and data.draw(st.integers(0, 4), label="leased") > 0:
            return data.draw(st.lists(st.sampled_from(leased), min_size=1, max_size=max_size, unique=True))
        picks = data.draw(st.lists(st.sampled_from(PROVIDERS), min_size=1, max_size=max_size))
        return [self.addresses[i] for i in picks]

    def _window_over(self, job: int) -> bool | None:
        j = self.m.jobs.get(job)
        if j is None or not j.settled_at:
            return True
        return self._after(j.settled_at + CONFIG.dispute_window_s, strict=False)

    def _dispute(self, data) -> int:
        open_ = [d for d, m in self.m.disputes.items() if m.state == 1]
        if open_ and data.draw(st.integers(0, 4), label="open dispute") > 0:
            return data.draw(st.sampled_from(open_), label="dispute")
        return data.draw(IDS, label="dispute")

    def _job_matches(self, job: int) -> None:
        j = self.m.jobs[job]
        view = self.ledger.job(job)
        assert (view.escrow_wei, view.owed_wei, view.epochs) == (j.escrow, j.owed, j.epochs)
        assert bool(view.settled_at) == bool(j.settled_at)
