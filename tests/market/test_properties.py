"""Stateful property test: providers, submitters and the coordinator act in any order.

Hypothesis posts, re-prices and withdraws offers, submits and changes bids,
tops up, pauses, resumes and finishes jobs, and clears rounds at increasing
times; the market alone decides what succeeds. The invariants come from
what a market is for: a device is leased to at most one job at a time; no
lease costs more than its job bid; a lease's price never changes; nobody is
billed past the time a device was held or past a job's escrow; preemption
only ever takes spot leases of strictly lower priority, with notice.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shoal.market import Market, MarketConfig, MarketError, OverReference, satisfies
from shoal.spec import FillStatus, Tenancy
from tests.market.factory import KINDS, REGIONS, TABLE, bid, offer

OFFER_IDS = [f"o{i}" for i in range(6)]
JOBS = [f"j{i}" for i in range(6)]  # the first few start, the rest arrive later
NOTICE_S = 30.0


def _end(lease) -> float:
    return float("inf") if lease.ends_at_s is None else max(lease.start_s, lease.ends_at_s)


class MarketMachine(RuleBasedStateMachine):
    @initialize(terms=st.lists(st.tuples(st.integers(1, 300), st.sampled_from(list(Tenancy))),
                               min_size=3, max_size=len(OFFER_IDS)),
                priorities=st.lists(st.integers(0, 3), min_size=2, max_size=3),
                policy=st.sampled_from(list(OverReference)))
    def start(self, policy, terms, priorities):
        self.market = Market(TABLE, MarketConfig(notice_period_s=NOTICE_S, over_reference=policy))
        self.now = 0.0
        self.prices: dict[int, int] = {}  # lease number -> price when first seen
        # Start with devices and jobs, so that rounds lease and preempt often.
        for offer_id, (price, tenancy) in zip(OFFER_IDS, terms):
            self.market.post_offer(offer(offer_id, price, kind="l4", tenancy=tenancy), 0.0)
        for job, priority in zip(JOBS, priorities):
            self.market.submit(bid(job, 2, max_price=300, budget=100_000, priority=priority), 0.0)

    def _at(self, dt: float) -> float:
        self.now += dt
        return self.now

    def _try(self, action):
        try:
            return action()
        except MarketError:
            return None  # refused: the invariants check it changed nothing they guard

    # ------------------------------------------------------------ providers
    @rule(offer_id=st.sampled_from(OFFER_IDS), owner=st.integers(0, 9).map(bool), price=st.integers(1, 600),
          kind=st.sampled_from(KINDS), region=st.sampled_from(REGIONS),
          tenancy=st.sampled_from(list(Tenancy)), speed=st.integers(1, 4))
    def post(self, offer_id, owner, price, kind, region, tenancy, speed):
        provider = f"prov-{offer_id}" if owner else "mallory"
        o = offer(offer_id, price, provider=provider, kind=kind, region=region,
                  tenancy=tenancy, speed=speed * 5.0)
        self._try(lambda: self.market.post_offer(o, self.now))

    @rule(offer_id=st.sampled_from(OFFER_IDS), dt=st.floats(0, 20))
    def withdraw(self, offer_id, dt):
        now = self._at(dt)
        self._try(lambda: self.market.withdraw_offer(offer_id, f"prov-{offer_id}", now))

    # ------------------------------------------------------------ submitters
    @rule(job=st.sampled_from(JOBS), workers=st.integers(1, 4), minimum=st.integers(1, 4),
          max_price=st.integers(1, 1_200), budget=st.integers(0, 2_000_000),
          priority=st.integers(0, 5), spot_only=st.booleans())
    def submit(self, job, workers, minimum, max_price, budget, priority, spot_only):
        tenancies = frozenset({Tenancy.spot}) if spot_only else frozenset(Tenancy)
        b = bid(job, workers, min_workers=min(minimum, workers), max_price=max_price,
                budget=budget, priority=priority, tenancies=tenancies)

        self._try(lambda: self.market.submit(b, self.now))

    @rule(job=st.sampled_from(JOBS), amount=st.integers(1, 50_000))
    def top_up(self, job, amount):
        self._try(lambda: self.market.top_up(job, amount))

    @rule(job=st.sampled_from(JOBS), dt=st.floats(0, 20), action=st.sampled_from(
        ["pause", "resume", "finish"]))
    def lifecycle(self, job, dt, action):
        now = self._at(dt)
        self._try(lambda: getattr(self.market, action)(job, now))

    # ------------------------------------------------------------ the coordinator
    @rule(dt=st.floats(0, 60))
    def clear(self, dt):
        now = self._at(dt)
        cleared = self.market.clear(now)
        for fill in cleared.fills:
            current = self.market.bid(fill.job)
            for lease in fill.new_leases:
                assert lease.price_wei_per_s <= current.max_price_wei_per_s
                assert satisfies(self.market.book.offer(lease.offer_id), current)
                assert lease.start_s >= now
            if fill.status is FillStatus.paused:
                assert fill.held == 0 and not fill.new_leases
            event(f"round: {fill.status.value}, {len(fill.new_leases)} new, {len(fill.notices)} notices")
            for notice in fill.notices:
                assert notice.lease.tenancy is Tenancy.spot
                assert notice.lease.priority < notice.by_priority
                assert notice.ends_at_s == now + NOTICE_S
        self._higher_priority_served_first(cleared)
        for job in {f.job for f in cleared.fills}:
            assert self.market.meter(job).accrued_wei(now) <= self.market.meter(job).budget_wei

    def _higher_priority_served_first(self, cleared):
        """A job left short got every device it could use before any lower-priority job did."""
        for high in cleared.fills:
            if high.status is not FillStatus.partial:
                continue  # full needs nothing; unfilled could not reach its minimum anyway
            wanted = self.market.bid(high.job)
            for low in cleared.fills:
                if self.market.bid(low.job).priority < wanted.priority:
                    for lease in low.new_leases:
                        assert not satisfies(self.market.book.offer(lease.offer_id), wanted)

    # ------------------------------------------------------------ invariants
    @invariant()
    def a_device_serves_one_job_at_a_time(self):
        for offer_id in OFFER_IDS:
            spans = sorted((l.start_s, _end(l)) for l in self.market.book.on_offer(offer_id))
            spans = [s for s in spans if s[1] > s[0]]
            for (_, end), (start, _) in zip(spans, spans[1:]):
                assert end <= start, f"{offer_id} leased twice at once: {spans}"

    @invariant()
    def a_lease_keeps_its_price_and_bills_only_time_held(self):
        for number, lease in self.market.book.leases.items():
            assert self.prices.setdefault(number, lease.price_wei_per_s) == lease.price_wei_per_s
            end = self.now if lease.ends_at_s is None else min(self.now, lease.ends_at_s)
            meter_charge = lease.price_wei_per_s * max(0.0, end - lease.start_s)
            assert self.market.meter(lease.job).charges(self.now)[number] <= meter_charge

    @invariant()
    def a_finished_job_holds_nothing(self):
        for job in JOBS:
            try:
                self.market.bid(job)
            except MarketError:
                held = self.market.book.held(job)  # finished, or never submitted
                assert held == []


TestMarketMachine = MarketMachine.TestCase
# 100 runs of 40 rules (about 40 s of CI); at 200 a run they held in every CI run before.
TestMarketMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
