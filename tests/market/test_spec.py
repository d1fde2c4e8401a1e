"""The market's spec values refuse what the market could not honour."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shoal.spec import Bid, DeviceLease, PriceTable, ReferencePrice, Tenancy
from tests.market.factory import bid, offer


def test_a_bid_cannot_need_more_workers_than_it_wants():
    with pytest.raises(ValidationError, match=r"min_workers \(3\) must not exceed workers \(2\)"):
        bid("j", 2, min_workers=3)


def test_a_bid_must_accept_some_tenancy():
    with pytest.raises(ValidationError, match="at least one of 'spot', 'on_demand'"):
        bid("j", tenancies=frozenset())


@pytest.mark.parametrize("price", [0, -5])
def test_free_or_negative_prices_are_refused(price):
    with pytest.raises(ValidationError):
        offer("o", price)
    with pytest.raises(ValidationError):
        bid("j", max_price=price)


def test_money_is_integer_wei():
    with pytest.raises(ValidationError):
        offer("o", 1.5)  # type: ignore[arg-type]


def test_price_table_lists_each_kind_once():
    with pytest.raises(ValidationError, match=r"listed twice.*'h100'"):
        PriceTable(prices=(ReferencePrice(device_kind="h100", on_demand_wei_per_s=1),
                           ReferencePrice(device_kind="h100", on_demand_wei_per_s=2)))


def _lease(price: int, reference: int | None) -> DeviceLease:
    return DeviceLease(lease=1, job="j", offer_id="o", provider="p", device_kind="h100",
                       region="eu", speed_samples_per_s=1.0, memory_gb=1.0,
                       tenancy=Tenancy.spot, priority=0, price_wei_per_s=price,
                       reference_wei_per_s=reference, start_s=0.0)


@pytest.mark.parametrize("price, reference, bps", [(300, 1000, 7000), (1000, 1000, 0),
                                                   (1200, 1000, -2000), (5, None, None)])
def test_a_lease_reports_its_discount_against_on_demand(price, reference, bps):
    assert _lease(price, reference).discount_bps == bps


def test_market_values_are_frozen_and_round_trip_as_json():
    b = bid("j", 2, regions=frozenset({"eu"}))
    with pytest.raises(ValidationError, match="frozen"):
        b.workers = 3  # type: ignore[misc]
    assert Bid.model_validate_json(b.model_dump_json()) == b
