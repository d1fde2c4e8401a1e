"""Per-second billing against escrow, and pausing before the escrow runs out."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shoal.market import JobMeter, Market, billed_seconds, charge_wei
from shoal.spec import DeviceLease, FillStatus, Tenancy
from tests.market.factory import TABLE, bid, offer

PROPERTY = settings(max_examples=150, deadline=None)


def lease(number: int = 1, price: int = 100, start: float = 0.0,
          ends: float | None = None) -> DeviceLease:
    return DeviceLease(lease=number, job="j", offer_id=f"o{number}", provider="p",
                       device_kind="h100", region="eu", speed_samples_per_s=1.0, memory_gb=1.0,
                       tenancy=Tenancy.spot, priority=0, price_wei_per_s=price,
                       reference_wei_per_s=None, start_s=start, ends_at_s=ends)


@st.composite
def leases(draw: st.DrawFn) -> tuple[DeviceLease, ...]:
    found = []
    for i in range(draw(st.integers(1, 4))):
        start = draw(st.floats(0.0, 50.0))
        ends = draw(st.none() | st.floats(0.0, 120.0).map(lambda d, s=start: s + d))
        found.append(lease(i + 1, draw(st.integers(1, 10**6)), start, ends))
    return tuple(found)


def test_billing_counts_whole_seconds_the_device_was_held():
    assert billed_seconds(lease(start=10.0), 9.0) == 0  # not started: nothing
    assert billed_seconds(lease(start=10.0), 12.9) == 2  # a part second is not billed
    assert billed_seconds(lease(start=0.0, ends=5.5), 100.0) == 5  # ended: no idle billing
    assert charge_wei(lease(price=7, start=0.0, ends=3.0), 99.0) == 21


def test_time_until_the_escrow_is_spent_follows_the_leases_ahead():
    meter = JobMeter("j", 3_000, (lease(1, 100, 0.0), lease(2, 100, 10.0, 20.0)))
    # 0–10 s: 100 wei/s; 10–20 s: 200 wei/s (3,000 by then); so spent at 20 s.
    assert meter.seconds_until_budget_exhausted(0.0) == pytest.approx(20.0)
    assert meter.seconds_until_budget_exhausted(25.0) == 0.0
    assert JobMeter("j", 10, ()).seconds_until_budget_exhausted(0.0) == math.inf


def test_pause_is_advised_one_step_before_the_escrow_would_be_exceeded():
    meter = JobMeter("j", 1_000, (lease(price=100),))  # 10 s of escrow
    assert not meter.should_pause(7.0, step_time_s=3.0)  # ends at 10 s: exactly affordable
    assert not meter.should_pause(7.5, step_time_s=3.0)  # 10.5 s: whole seconds bill 10
    assert meter.should_pause(8.0, step_time_s=3.0)
    assert meter.should_pause(7.0, step_time_s=2.0, checkpoint_s=2.0)


@PROPERTY
@given(held=leases(), now=st.floats(0.0, 300.0))
def test_nobody_is_billed_beyond_the_time_a_lease_ran(held, now):
    for item in held:
        end = now if item.ends_at_s is None else min(now, item.ends_at_s)
        assert billed_seconds(item, now) <= max(0.0, end - item.start_s)
        assert charge_wei(item, now) <= item.price_wei_per_s * max(0.0, end - item.start_s)


@PROPERTY
@given(held=leases(), budget=st.integers(0, 10**8), now=st.floats(0.0, 100.0),
       later=st.floats(0.0, 1.0))
def test_the_exhaustion_projection_is_never_late(held, budget, now, later):
    meter = JobMeter("j", budget, held)
    at = meter.exhausted_at_s(now)
    if at == math.inf:
        assert meter.accrued_wei(now + 10**6) <= budget
    elif at > now:
        assert meter.accrued_wei(now + later * (at - now)) <= budget


@PROPERTY
@given(held=leases(), budget=st.integers(0, 10**8), step_bound=st.floats(0.1, 20.0),
       checkpoint=st.floats(0.0, 5.0), steps=st.lists(st.floats(0.0, 1.0), min_size=1,
                                                      max_size=200))
def test_spend_stays_within_escrow_when_the_pause_advice_is_followed(
        held, budget, step_bound, checkpoint, steps):
    now = min(item.start_s for item in held)
    meter = JobMeter("j", budget, held)
    assume(meter.accrued_wei(now + checkpoint) <= budget)  # the job was affordable to begin
    for fraction in steps:
        if meter.should_pause(now, step_bound, checkpoint):
            break
        now += fraction * step_bound  # each step takes at most the bound it was checked with
    stop = now + checkpoint  # checkpoint, then release every device
    ended = tuple(l.model_copy(update={"ends_at_s": stop if l.ends_at_s is None
                                       else min(stop, l.ends_at_s)}) for l in held)
    assert JobMeter("j", budget, ended).accrued_wei(stop + 10**6) <= budget


@PROPERTY
@given(prices=st.lists(st.integers(1, 10**15), min_size=1, max_size=4),
       budget=st.integers(1, 10**18), late=st.floats(0.0, 10**5))
def test_a_job_that_ignores_the_advice_is_stopped_at_its_escrow(prices, budget, late):
    market = Market(TABLE)
    for i, price in enumerate(prices):
        market.post_offer(offer(f"o{i}", 1, kind="l4").model_copy(
            update={"price_wei_per_s": min(price, 300)}), 0.0)
    market.submit(bid("j", len(prices), max_price=300, budget=budget), 0.0)
    market.clear(0.0)
    market.advance(late)  # the coordinator looks only now, and then much later
    assert market.meter("j").accrued_wei(late) <= budget
    much_later = late + 10**7
    spent_by = market.meter("j").exhausted_at_s(0.0)
    market.advance(much_later)
    if spent_by <= much_later:  # spent: every device released, nothing more ever billed
        assert all(l.ends_at_s is not None for l in market.book.of_job("j"))
        assert market.meter("j").accrued_wei(much_later * 2) <= budget
        assert market.clear(much_later).fill("j").status is FillStatus.paused
    assert market.meter("j").accrued_wei(much_later) <= budget
