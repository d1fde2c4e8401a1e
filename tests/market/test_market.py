"""Clearing rounds across jobs: priority order, preemption with notice, the job's lifecycle."""

from __future__ import annotations

import pytest

from shoal.market import (
    BidConflict, ClockWentBack, JobFinished, Market, MarketConfig, MarketError,
    OfferAboveReference, OverReference, UnknownJob,
)
from shoal.spec import FillStatus, Tenancy
from tests.market.factory import TABLE, bid, offer


def market_with(*offers, config=None) -> Market:
    market = Market(TABLE, config)
    for o in offers:
        market.post_offer(o, 0.0)
    return market


def test_jobs_are_served_in_priority_order():
    market = market_with(offer("cheap", 100), offer("dear", 400))
    market.submit(bid("low", priority=1), 0.0)
    market.submit(bid("high", priority=9), 0.0)
    round_ = market.clear(0.0)
    assert [f.job for f in round_.fills] == ["high", "low"]
    assert round_.fill("high").new_leases[0].offer_id == "cheap"
    assert round_.fill("low").new_leases[0].offer_id == "dear"


def _cleared_in_order(seed: int) -> dict[str, list[str]]:
    import random

    offers = [offer(f"o{i}", 100 + 50 * (i % 3), speed=5.0 * (1 + i % 2)) for i in range(8)]
    bids = [bid(f"j{i}", 1 + i % 3, priority=i % 2, max_price=150 + 50 * (i % 2))
            for i in range(5)]
    random.Random(seed).shuffle(offers)
    random.Random(seed + 1).shuffle(bids)
    market = market_with(*offers)
    for b in bids:
        market.submit(b, 0.0)
    cleared = market.clear(0.0)
    return {f.job: sorted(lease.offer_id for lease in f.new_leases) for f in cleared.fills}


def test_the_same_offers_and_bids_clear_the_same_way_whatever_their_arrival_order():
    first = _cleared_in_order(0)
    assert all(_cleared_in_order(seed) == first for seed in range(1, 6))
    # Every device a bid could afford was leased; the two at 200 wei/s exceed the 150 of j4.
    assert sum(map(len, first.values())) == 6 and first["j4"] == []


def test_a_lease_reports_its_discount_against_on_demand():
    market = market_with(offer("o", 250, kind="h100"))
    market.submit(bid("j"), 0.0)
    lease = market.clear(0.0).fill("j").new_leases[0]
    assert (lease.reference_wei_per_s, lease.discount_bps) == (1_000, 7_500)


def test_offers_above_on_demand_are_refused_or_flagged_by_policy():
    with pytest.raises(OfferAboveReference, match="ask at most 1000 wei/s"):
        market_with(offer("greedy", 1_001, kind="h100"))
    with pytest.raises(OfferAboveReference, match="add it to the price table"):
        market_with(offer("odd", 10, kind="tpu-v9"))
    flagged = market_with(offer("greedy", 1_500, kind="h100"),
                          config=MarketConfig(over_reference=OverReference.flag))
    flagged.submit(bid("j", max_price=2_000), 0.0)
    assert flagged.clear(0.0).fill("j").new_leases[0].discount_bps == -5_000


def test_a_higher_priority_job_preempts_a_lower_spot_lease_with_notice():
    market = market_with(offer("s", 100), config=MarketConfig(notice_period_s=30.0))
    market.submit(bid("low", priority=0), 0.0)
    victim = market.clear(0.0).fill("low").new_leases[0]
    market.submit(bid("high", priority=5), 10.0)
    fill = market.clear(10.0).fill("high")
    (notice,) = fill.notices
    assert market.clear(10.0).notices == () and notice.lease.job == "low"
    assert notice.lease == victim and notice.by_job == "high" and notice.ends_at_s == 40.0
    (taken,) = fill.new_leases
    assert taken.start_s == 40.0  # the new holder starts when the victim's notice is over
    # The victim keeps running, and billing, through its notice, then stops.
    assert market.meter("low").accrued_wei(1_000.0) == 40 * 100
    assert market.meter("high").accrued_wei(41.0) == 1 * 100


@pytest.mark.parametrize("tenancy, victim_priority", [(Tenancy.on_demand, 0), (Tenancy.spot, 5)])
def test_on_demand_and_equal_priority_leases_are_never_preempted(tenancy, victim_priority):
    market = market_with(offer("d", 100, tenancy=tenancy))
    market.submit(bid("first", priority=victim_priority), 0.0)
    market.clear(0.0)
    market.submit(bid("second", priority=5), 1.0)
    fill = market.clear(1.0).fill("second")
    assert fill.status is FillStatus.unfilled and fill.notices == ()


def test_a_preempted_spot_job_is_not_moved_to_on_demand_above_its_bid():
    market = market_with(offer("spot", 100), offer("od", 800, tenancy=Tenancy.on_demand))
    market.submit(bid("low", max_price=200, priority=0), 0.0)
    market.clear(0.0)
    market.submit(bid("high", max_price=200, priority=5), 1.0)
    market.clear(1.0)
    refill = market.clear(60.0).fill("low")
    assert refill.status is FillStatus.unfilled and refill.new_leases == ()
    assert "ask above max_price_wei_per_s=200 (cheapest 800" in refill.reason
    assert all(l.price_wei_per_s <= 200 for l in market.book.of_job("low"))


def test_a_finished_job_stops_billing_at_once():
    market = market_with(offer("a", 100), offer("b", 200))
    market.submit(bid("j", 2), 0.0)
    market.clear(0.0)
    final = market.finish("j", 12.5)
    assert final.accrued_wei(10_000.0) == 12 * 300
    assert {o.offer_id for o in market.book.free_offers(12.5)} == {"a", "b"}
    with pytest.raises(JobFinished, match="submit a new job id"):
        market.submit(bid("j"), 13.0)


def test_a_paused_job_holds_nothing_until_resumed():
    market = market_with(offer("a", 100))
    market.submit(bid("j"), 0.0)
    market.clear(0.0)
    market.pause("j", 5.0)
    assert market.clear(6.0).fill("j").status is FillStatus.paused
    assert market.meter("j").accrued_wei(100.0) == 500
    market.resume("j", 7.0)
    assert market.clear(7.0).fill("j").status is FillStatus.full


def test_a_job_that_wants_fewer_workers_lets_its_dearest_devices_go():
    market = market_with(offer("a", 100), offer("b", 300), offer("c", 200))
    market.submit(bid("j", 3), 0.0)
    market.clear(0.0)
    market.submit(bid("j", 1), 10.0)
    assert [l.offer_id for l in market.book.held("j")] == ["a"]


def test_a_withdrawn_device_ends_its_lease_and_the_job_is_refilled():
    market = market_with(offer("a", 100), offer("b", 200))
    market.submit(bid("j"), 0.0)
    market.clear(0.0)
    (ended,) = market.withdraw_offer("a", "prov-a", 20.0)
    assert ended.ends_at_s == 20.0
    assert market.clear(20.0).fill("j").new_leases[0].offer_id == "b"


def test_bid_changes_that_would_break_running_leases_are_refused():
    market = market_with(offer("a", 300))
    market.submit(bid("j", max_price=500, budget=10_000), 0.0)
    market.clear(0.0)
    with pytest.raises(BidConflict, match="pause the job"):
        market.submit(bid("j", max_price=200, budget=10_000), 1.0)
    with pytest.raises(BidConflict, match="never withdrawn"):
        market.submit(bid("j", max_price=500, budget=9_000), 1.0)
    with pytest.raises(BidConflict, match="priority is fixed"):
        market.submit(bid("j", max_price=500, budget=10_000, priority=3), 1.0)


def test_errors_name_the_mistake_and_the_fix():
    market = market_with()
    with pytest.raises(UnknownJob, match="submit a bid for it first"):
        market.pause("ghost", 0.0)
    with pytest.raises(MarketError, match="at least 1 wei"):
        market.submit(bid("j"), 0.0) or market.top_up("j", 0)
    market.clear(50.0)
    with pytest.raises(ClockWentBack, match="one monotonic clock"):
        market.clear(49.0)
    with pytest.raises(MarketError, match="finite number of seconds"):
        MarketConfig(notice_period_s=float("nan"))
    assert isinstance(ClockWentBack(1.0, 2.0), MarketError)


def test_a_providers_leases_stop_where_its_allowance_is_billed_and_it_takes_no_more():
    """p's chain lease can book 100 s at its price: however much escrow the job has, its
    lease stops where it has billed that (back-dated to then, in whole seconds), p is
    not leased to the job again though its device is free, and q's lease runs on."""
    market = market_with(offer("p-d0", 100, provider="p"), offer("q-d0", 120, provider="q"))
    market.submit(bid("j", 2, budget=10**9), 0.0)
    market.clear(0.0)
    market.allow("j", "p", 100 * 100, 0.5)
    assert market.clear(99.0).stopped == ()
    cleared = market.clear(150.0)
    (stopped,) = cleared.stopped
    assert (stopped.provider, stopped.ends_at_s) == ("p", 100.0)
    assert cleared.spent == (("j", "p"),)
    assert market.meter("j").charges(150.0)[stopped.lease] == 100 * 100
    assert cleared.fill("j").new_leases == ()  # p-d0 is free, and barred from j
    assert market.clear(151.0).spent == ()  # reported once
    running = [lease for lease in market.meter("j").leases if lease.ends_at_s is None]
    assert [lease.provider for lease in running] == ["q"]
    # Another job may lease p's device: the allowance is p's in j only.
    market.submit(bid("k"), 152.0)
    assert market.clear(152.0).fill("k").new_leases[0].offer_id == "p-d0"


def test_an_allowance_counts_every_lease_of_the_provider_in_the_job():
    """Spent over two leases (a pause between them), it stops the second where their sum
    reaches it."""
    market = market_with(offer("p-d0", 100, provider="p"))
    market.submit(bid("j", budget=10**9), 0.0)
    market.clear(0.0)
    market.allow("j", "p", 100 * 100, 0.0)
    market.pause("j", 60.0)
    market.resume("j", 70.0)
    market.clear(70.0)
    (stopped,) = market.clear(200.0).stopped
    assert stopped.ends_at_s == 110.0  # 60 s, then 40 more from 70
    assert sum(market.meter("j").charges(200.0).values()) == 100 * 100
