"""The reverse auction for one job: the cheapest offers that satisfy its bid.

Pure functions over values, so the simulator can run them at scale and the
tests can hold them against brute force. Every requirement in a bid is per
device, so the cheapest feasible set of k devices is the k cheapest offers
that each satisfy it; ties go to the faster device, then the smaller offer id,
so the same book always clears the same way. A cap on devices per provider
keeps that true taken in the same order: the cheapest fitting offers, skipping
those of a provider already at its cap (sets within per-provider caps form a
partition matroid, on which the greedy choice is the cheapest).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from shoal.spec.market import Bid, DeviceLease, FillStatus, Offer, Tenancy

T = TypeVar("T")


def satisfies(offer: Offer, bid: Bid) -> bool:
    """Whether one device meets every requirement of the bid, price included."""
    return offer.price_wei_per_s <= bid.max_price_wei_per_s and fits_device(offer, bid)


def fits_device(offer: Offer, bid: Bid) -> bool:
    """Whether the device itself would do, whatever it asks."""
    return (
        offer.speed_samples_per_s >= bid.min_speed_samples_per_s
        and offer.memory_gb >= bid.min_memory_gb
        and (not bid.regions or offer.region in bid.regions)
        and offer.tenancy in bid.tenancies
        and (bid.torch is None or offer.torch == bid.torch)
    )


def rank(offer: Offer) -> tuple[int, float, str]:
    """Auction order: cheaper first, then faster, then by offer id (deterministic)."""
    return (offer.price_wei_per_s, -offer.speed_samples_per_s, offer.offer_id)


def cheapest(bid: Bid, offers: Iterable[Offer], count: int, ranked: bool = False,
             held_by: Mapping[str, int] | None = None) -> list[Offer]:
    """Up to `count` offers that satisfy the bid, cheapest first, within the bid's cap
    on devices per provider (`held_by`: devices each provider holds for the job already).

    `ranked`: the offers already come in `rank` order, so the scan stops at
    the count-th fit (a clearing round ranks the free offers once for all jobs).
    """
    fitting = (o for o in offers if satisfies(o, bid))
    if not ranked:
        fitting = iter(sorted(fitting, key=rank))
    capped = within_cap(bid, fitting, lambda o: o.provider, collections.Counter(held_by or {}))
    return list(itertools.islice(capped, max(count, 0)))


def within_cap(bid: Bid, items: Iterable[T], provider_of: Callable[[T], str],
               counts: collections.Counter) -> Iterator[T]:
    """`items` in order, skipping those whose provider has `max_devices_per_provider` of
    the job's devices already (`counts`, updated as items are taken)."""
    for item in items:
        provider = provider_of(item)
        if bid.max_devices_per_provider is not None and \
                counts[provider] >= bid.max_devices_per_provider:
            continue
        counts[provider] += 1
        yield item


@dataclass(frozen=True)
class Preemptible:
    """A running spot lease another job may take, and the offer as it stands now."""

    lease: DeviceLease
    offer: Offer  # current terms: the new holder pays what the provider asks today


@dataclass(frozen=True)
class Selection:
    """What one job gets in a round: free offers, and spot leases to take with notice."""

    status: FillStatus
    free: tuple[Offer, ...] = ()
    taken: tuple[Preemptible, ...] = ()
    reason: str = ""


def may_preempt(bid: Bid, candidate: Preemptible) -> bool:
    """Only a spot lease of a strictly lower priority, on a device that fits this bid."""
    return (
        candidate.lease.tenancy is Tenancy.spot
        and candidate.offer.tenancy is Tenancy.spot
        and candidate.lease.priority < bid.priority
        and satisfies(candidate.offer, bid)
    )


def _victim_order(candidate: Preemptible) -> tuple[int, tuple[int, float, str]]:
    # The lowest priority loses first; among equals, the cheapest device for us.
    return (candidate.lease.priority, rank(candidate.offer))


def select(bid: Bid, held: int, free: Sequence[Offer],
           preemptible: Sequence[Preemptible] = (), ranked: bool = False,
           held_by: Mapping[str, int] | None = None) -> Selection:
    """Fill the bid's shortfall over `held` leases (`held_by`: of them, how many each
    provider holds): free offers first, then preemption.

    Preemption disrupts another job, so it only makes up what free offers
    cannot; and nothing at all is leased when even both leave the job below
    its minimum (it could not run, and would pay for idle devices).
    """
    need = bid.workers - held
    if need <= 0:
        return Selection(FillStatus.full)
    chosen = cheapest(bid, free, need, ranked, held_by)
    short = need - len(chosen)
    taken: list[Preemptible] = []
    if short > 0:
        counts = collections.Counter(held_by or {})
        counts.update(o.provider for o in chosen)
        eligible = sorted((c for c in preemptible if may_preempt(bid, c)), key=_victim_order)
        taken = list(itertools.islice(
            within_cap(bid, eligible, lambda c: c.offer.provider, counts), short))
    total = held + len(chosen) + len(taken)
    if total < bid.min_workers:
        return Selection(FillStatus.unfilled,
                         reason=shortfall_reason(bid, held, free, total, held_by))
    if total < bid.workers:
        reason = shortfall_reason(bid, held, free, total, held_by)
        return Selection(FillStatus.partial, tuple(chosen), tuple(taken), reason)
    return Selection(FillStatus.full, tuple(chosen), tuple(taken))


def shortfall_reason(bid: Bid, held: int, offers: Sequence[Offer], reachable: int,
                     held_by: Mapping[str, int] | None = None) -> str:
    """Why a bid is short, with the change that would help most."""
    over_price = [o for o in offers
                  if o.price_wei_per_s > bid.max_price_wei_per_s and fits_device(o, bid)]
    head = (f"job '{bid.job}' can reach {reachable} of {bid.workers} workers "
            f"(minimum {bid.min_workers}; holds {held})")
    cap = bid.max_devices_per_provider
    if cap is not None:
        fitting = [o for o in offers if satisfies(o, bid)]
        capped = len(fitting) - len(cheapest(bid, fitting, len(fitting), held_by=held_by))
        if capped:
            return (f"{head}; {capped} more fitting offers are from providers that hold "
                    f"{cap} of its devices already (max_devices_per_provider): wait for "
                    "other providers' devices")
    if over_price:
        lowest = min(o.price_wei_per_s for o in over_price)
        return (f"{head}; {len(over_price)} more fitting offers ask above max_price_wei_per_s="
                f"{bid.max_price_wei_per_s} (cheapest {lowest} wei/s): raise the max price, "
                "or wait for devices to free up")
    return (f"{head}; no other free device meets its speed, memory, region and tenancy "
            "requirements: relax them, lower min_workers, or wait for devices to free up")
