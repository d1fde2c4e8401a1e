"""The market journal: each command stores the `kind`/`payload` JSON stores already
hold, and a journal read back rebuilds the market its live commands made."""

from __future__ import annotations

import pytest

from shoal.coordinator.services import journal
from shoal.market import Market, MarketConfig
from tests.market.factory import TABLE, bid, offer

OFFER = offer("o1", 100, provider="p1")
BID = bid("j1", 1, budget=10**20)  # past 2**53: the payload keeps wei exact as text


def test_each_command_stores_the_shape_stores_already_hold():
    """Rows written before commands were typed must still replay: the same JSON."""
    rows = [
        (journal.PostOffer(offer=OFFER), "post_offer", {"offer": OFFER.model_dump(mode="json")}),
        (journal.WithdrawOffer(offer_id="o1", provider="p1"), "withdraw_offer",
         {"offer_id": "o1", "provider": "p1"}),
        (journal.Submit(bid=BID), "submit", {"bid": BID.model_dump(mode="json")}),
        (journal.TopUp(job="j1", amount_wei=10**20), "top_up",
         {"job": "j1", "amount_wei": str(10**20)}),
        (journal.Pause(job="j1"), "pause", {"job": "j1"}),
        (journal.Resume(job="j1"), "resume", {"job": "j1"}),
        (journal.Finish(job="j1"), "finish", {"job": "j1"}),
        (journal.BarProvider(job="j1", provider="p1"), "bar_provider",
         {"job": "j1", "provider": "p1"}),
        (journal.AllowProvider(job="j1", provider="p1", wei=5), "allow_provider",
         {"job": "j1", "provider": "p1", "wei": "5"}),
        (journal.Clear(), "clear", {}),
    ]
    for command, kind, payload in rows:
        assert journal.stored(command) == (kind, payload)
        assert journal.parsed(kind, payload) == command


def test_a_kind_nobody_knows_is_refused():
    with pytest.raises(ValueError):
        journal.parsed("mint_money", {"job": "j1"})


def test_the_journal_read_back_rebuilds_the_market_it_made():
    live = Market(TABLE, MarketConfig(notice_period_s=2.0))
    commands = [(journal.PostOffer(offer=OFFER), 0.0),
                (journal.PostOffer(offer=offer("o2", 150, provider="p2")), 0.5),
                (journal.Submit(bid=bid("j1", 2, budget=10**9)), 1.0), (journal.Clear(), 1.0),
                (journal.TopUp(job="j1", amount_wei=10**6), 2.0),
                (journal.BarProvider(job="j1", provider="p2"), 3.0), (journal.Clear(), 3.0),
                (journal.Pause(job="j1"), 4.0), (journal.Resume(job="j1"), 5.0),
                (journal.Clear(), 5.0)]
    rows = []
    for command, at_s in commands:
        journal.apply(live, command, at_s)
        rows.append((*journal.stored(command), at_s))
    rebuilt = Market(TABLE, MarketConfig(notice_period_s=2.0))
    for kind, payload, at_s in rows:
        journal.apply(rebuilt, journal.parsed(kind, payload), at_s)
    assert rebuilt.book.leases == live.book.leases and live.book.leases
    assert journal.apply(rebuilt, journal.Finish(job="j1"), 6.0) == \
        journal.apply(live, journal.Finish(job="j1"), 6.0)
