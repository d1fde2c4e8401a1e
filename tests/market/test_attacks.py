"""Attacks on the market's money: each move of a cheating party, then what it got.

Each test plays the attacker's moves and asserts that it ended no better off
than playing honestly, and the honest party no worse off (STYLE 11).
"""

from __future__ import annotations

import pytest

from shoal.market import BidConflict, ClockWentBack, Market, MarketConfig, OfferNotYours
from shoal.spec import FillStatus
from tests.market.factory import TABLE, bid, offer


def running(*offers, job_bid=None, notice_s: float = 30.0) -> Market:
    """A market in which job 'j' holds the given devices from t = 0."""
    market = Market(TABLE, MarketConfig(notice_period_s=notice_s))
    for o in offers:
        market.post_offer(o, 0.0)
    market.submit(job_bid or bid("j", len(offers), max_price=500, budget=10**6), 0.0)
    market.clear(0.0)
    return market


def test_a_provider_that_underbids_then_raises_its_price_is_billed_the_agreed_price():
    market = running(offer("bait", 100))
    market.post_offer(offer("bait", 900), 10.0)  # raise after winning
    market.clear(20.0)
    assert market.meter("j").accrued_wei(60.0) == 60 * 100  # the running lease's price holds
    # The new price applies only to a new lease, and only if a bid accepts it.
    market.finish("j", 60.0)
    market.submit(bid("k", max_price=500), 61.0)
    assert market.clear(61.0).fill("k").status is FillStatus.unfilled


def test_a_provider_cannot_escape_its_lease_and_resell_above_the_bid():
    market = running(offer("flip", 100))
    market.withdraw_offer("flip", "prov-flip", 30.0)
    market.post_offer(offer("flip", 800), 30.0)  # back at once, dearer than the job pays
    refill = market.clear(30.0).fill("j")
    assert refill.new_leases == ()
    assert market.meter("j").accrued_wei(1_000.0) == 30 * 100  # paid only for the time it served


def test_another_provider_cannot_reprice_or_pull_an_honest_providers_device():
    market = running(offer("honest", 100))
    with pytest.raises(OfferNotYours, match="belongs to provider 'prov-honest'"):
        market.post_offer(offer("honest", 1, provider="mallory"), 5.0)
    with pytest.raises(OfferNotYours):
        market.withdraw_offer("honest", "mallory", 5.0)
    assert market.book.held("j")[0].offer_id == "honest"
    assert market.meter("j").accrued_wei(100.0) == 100 * 100  # the honest provider's pay


def test_a_submitter_cannot_lower_its_price_under_running_leases():
    market = running(offer("a", 400))
    with pytest.raises(BidConflict):
        market.submit(bid("j", max_price=100, budget=10**6), 10.0)
    assert market.bid("j").max_price_wei_per_s == 500
    assert market.meter("j").accrued_wei(50.0) == 50 * 400  # the provider is billed as agreed


def test_a_submitter_cannot_withdraw_escrow_from_under_running_leases():
    market = running(offer("a", 400))
    with pytest.raises(BidConflict, match="never withdrawn"):
        market.submit(bid("j", max_price=500, budget=1), 10.0)
    assert market.meter("j").budget_wei == 10**6


def test_a_submitter_that_ignores_the_pause_advice_gets_no_work_beyond_its_escrow():
    market = running(offer("a", 100), job_bid=bid("j", max_price=500, budget=1_000))
    assert market.meter("j").should_pause(8.0, step_time_s=5.0)  # the advice it ignores
    market.clear(60.0)  # the coordinator's next round, long after the escrow ran out
    (lease,) = market.book.of_job("j")
    assert lease.ends_at_s == pytest.approx(10.0)  # billing stopped when the escrow did
    assert market.meter("j").accrued_wei(1e9) == 1_000  # all of it, and nothing unpaid
    assert market.book.free_offers(60.0)[0].offer_id == "a"  # the device is free to earn again


def test_a_submitter_cannot_raise_priority_to_shield_or_grab_devices():
    market = running(offer("a", 100), job_bid=bid("j", max_price=500, budget=10**6, priority=0))
    with pytest.raises(BidConflict, match="priority is fixed"):
        market.submit(bid("j", max_price=500, budget=10**6, priority=9), 5.0)
    market.submit(bid("urgent", max_price=500, priority=5), 5.0)
    assert market.clear(5.0).fill("urgent").notices[0].lease.job == "j"


def test_a_preemptor_that_leaves_at_once_still_gave_the_victim_its_notice():
    market = running(offer("s", 100), notice_s=30.0)
    market.submit(bid("grab", max_price=500, priority=9), 10.0)
    market.clear(10.0)
    market.finish("grab", 11.0)
    assert market.meter("grab").accrued_wei(1e6) == 0  # its lease never started: nothing owed
    assert market.meter("j").accrued_wei(1e6) == 40 * 100  # the victim ran to its notice's end
    assert market.clear(40.0).fill("j").new_leases[0].offer_id == "s"  # and may take it back


def test_a_finished_job_is_never_billed_again():
    market = running(offer("a", 100))
    final = market.finish("j", 25.0).accrued_wei(25.0)
    market.clear(500.0)
    market.advance(900.0)
    assert market.meter("j").accrued_wei(1e9) == final == 25 * 100


def test_a_caller_cannot_move_the_clock_back_to_rebill():
    market = running(offer("a", 100))
    market.finish("j", 30.0)
    with pytest.raises(ClockWentBack):
        market.clear(10.0)
    assert market.meter("j").accrued_wei(1e9) == 30 * 100
