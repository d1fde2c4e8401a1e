"""The compute market: a reverse auction for devices, preemption with notice, escrow billing.

Pure (plain Python, no I/O): the coordinator calls it with the time it acts
at, and the simulator drives the same code at the scale of many devices.
"""

from shoal.market.auction import Preemptible, Selection, cheapest, satisfies, select
from shoal.market.book import LeaseBook
from shoal.market.errors import (
    BidConflict,
    ClockWentBack,
    JobFinished,
    MarketError,
    OfferAboveReference,
    OfferNotYours,
    UnknownJob,
    UnknownOffer,
)
from shoal.market.market import Clearing, Market, MarketConfig
from shoal.market.meter import JobMeter, billed_seconds, charge_wei
from shoal.market.pricing import OverReference, check_offer

__all__ = [
    "BidConflict",
    "Clearing",
    "ClockWentBack",
    "JobFinished",
    "JobMeter",
    "LeaseBook",
    "Market",
    "MarketConfig",
    "MarketError",
    "OfferAboveReference",
    "OfferNotYours",
    "OverReference",
    "Preemptible",
    "Selection",
    "UnknownJob",
    "UnknownOffer",
    "billed_seconds",
    "charge_wei",
    "cheapest",
    "check_offer",
    "satisfies",
    "select",
]
