"""Offers measured against the on-demand price index.

An offer above what a cloud charges on demand is either refused or let in
flagged, by policy; each lease carries its reference so a submitter sees
what it saved.
"""

from __future__ import annotations

import enum

from shoal.market.errors import OfferAboveReference
from shoal.spec.market import Offer, PriceTable


class OverReference(str, enum.Enum):
    """What to do with an offer priced above the on-demand reference of its kind."""

    reject = "reject"  # refused at posting, as is a kind with no reference
    flag = "flag"  # accepted; its leases show a negative discount


def check_offer(offer: Offer, table: PriceTable, policy: OverReference) -> int | None:
    """The offer's on-demand reference (None if its kind has none), or OfferAboveReference."""
    reference = table.on_demand_wei_per_s(offer.device_kind)
    if policy is OverReference.flag:
        return reference
    if reference is None or offer.price_wei_per_s > reference:
        raise OfferAboveReference(offer.offer_id, offer.price_wei_per_s, reference,
                                  offer.device_kind)
    return reference
