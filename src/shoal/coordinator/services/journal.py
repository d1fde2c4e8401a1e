"""The market's command journal: every call that changed the market, in order.

The market is pure and deterministic, so replaying its commands with the
times they were made at rebuilds it exactly: that is how a coordinator that
was killed comes back with the same leases, escrows and paused jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shoal.coordinator.db.schema import MarketCommandRow
from shoal.market import Clearing, Market
from shoal.spec.market import Bid, Offer


def apply(market: Market, kind: str, payload: dict[str, Any], at_s: float) -> Any:
    """Carry out one journaled command on `market` (live, or in a replay)."""
    if kind == "post_offer":
        return market.post_offer(Offer.model_validate(payload["offer"]), at_s)
    if kind == "withdraw_offer":
        return market.withdraw_offer(payload["offer_id"], payload["provider"], at_s)
    if kind == "submit":
        return market.submit(Bid.model_validate(payload["bid"]), at_s)
    if kind == "top_up":
        return market.top_up(payload["job"], int(payload["amount_wei"]))
    if kind == "pause":
        return market.pause(payload["job"], at_s)
    if kind == "resume":
        return market.resume(payload["job"], at_s)
    if kind == "finish":
        return market.finish(payload["job"], at_s)
    if kind == "bar_provider":
        return market.bar(payload["job"], payload["provider"], at_s)
    if kind == "allow_provider":
        return market.allow(payload["job"], payload["provider"], int(payload["wei"]), at_s)
    if kind == "clear":
        return market.clear(at_s)
    raise ValueError(f"unknown market command {kind!r} in the journal")


def replay(market: Market, rows: Iterable[MarketCommandRow]) -> int:
    """Apply journaled commands in order; returns how many were applied."""
    count = 0
    for row in rows:
        apply(market, row.kind, row.payload, row.at_s)
        count += 1
    return count


def changed(clearing: Clearing, last_status: dict[str, str]) -> bool:
    """Whether a clearing round changed anything a replay must reproduce.

    A round that leased nothing, stopped nothing and moved no job between
    full, partial, unfilled and paused leaves the market as it found it, so
    it is not journaled (rounds run every second).
    """
    if clearing.stopped or any(f.new_leases or f.notices for f in clearing.fills):
        return True
    return any(last_status.get(f.job) != f.status.value for f in clearing.fills)
