"""The lease book: which offers are posted, and which job holds each device when.

It keeps one rule that everything else relies on: an offer's leases never
overlap in time, so a device is never sold to two jobs at once. Leases are
kept after they end, as the record that billing is computed from.
"""

from __future__ import annotations

from collections.abc import Iterator

from shoal.market.auction import Preemptible
from shoal.market.errors import OfferNotYours, UnknownOffer
from shoal.spec.market import Bid, DeviceLease, Offer, Tenancy


def _open_at(lease: DeviceLease, now_s: float) -> bool:
    """Whether the lease still holds (or has reserved) its device at `now_s` or later."""
    return lease.ends_at_s is None or lease.ends_at_s > now_s


class LeaseBook:
    """Offers by id, leases by number; the market's single record of who holds what."""

    def __init__(self) -> None:
        self.offers: dict[str, Offer] = {}
        self.leases: dict[int, DeviceLease] = {}
        self._by_offer: dict[str, list[int]] = {}  # lease numbers per offer, in order
        self._by_job: dict[str, list[int]] = {}

    # ------------------------------------------------------------ offers
    def post(self, offer: Offer) -> None:
        """Add an offer or change its terms; running leases keep the terms they were made on."""
        known = self.offers.get(offer.offer_id)
        if known is not None and known.provider != offer.provider:
            raise OfferNotYours(offer.offer_id, known.provider, offer.provider)
        self.offers[offer.offer_id] = offer
        self._by_offer.setdefault(offer.offer_id, [])

    def withdraw(self, offer_id: str, provider: str) -> Offer:
        offer = self.offer(offer_id)
        if offer.provider != provider:
            raise OfferNotYours(offer_id, offer.provider, provider)
        return self.offers.pop(offer_id)

    def offer(self, offer_id: str) -> Offer:
        try:
            return self.offers[offer_id]
        except KeyError:
            raise UnknownOffer(offer_id) from None

    def free_offers(self, now_s: float) -> list[Offer]:
        """Posted offers that no lease holds or has reserved from `now_s` on."""
        return [o for o in self.offers.values() if self.holder(o.offer_id, now_s) is None]

    # ------------------------------------------------------------ leases
    def holder(self, offer_id: str, now_s: float) -> DeviceLease | None:
        """The lease that holds or has reserved the device at or after `now_s`, if any."""
        for number in reversed(self._by_offer.get(offer_id, ())):
            lease = self.leases[number]
            if _open_at(lease, now_s):
                return lease
        return None

    def open(self, bid: Bid, offer: Offer, start_s: float, reference: int | None) -> DeviceLease:
        """Lease the device to the bid's job from `start_s`, at the price the offer asks."""
        lease = DeviceLease(
            lease=len(self.leases) + 1, job=bid.job, offer_id=offer.offer_id,
            provider=offer.provider, device_kind=offer.device_kind, region=offer.region,
            speed_samples_per_s=offer.speed_samples_per_s, memory_gb=offer.memory_gb,
            tenancy=offer.tenancy, priority=bid.priority, price_wei_per_s=offer.price_wei_per_s,
            reference_wei_per_s=reference, start_s=start_s,
        )
        self.leases[lease.lease] = lease
        self._by_offer.setdefault(offer.offer_id, []).append(lease.lease)
        self._by_job.setdefault(bid.job, []).append(lease.lease)
        return lease

    def end(self, number: int, at_s: float) -> DeviceLease:
        """End a lease at `at_s` (or keep an earlier end): billing stops there."""
        lease = self.leases[number]
        if lease.ends_at_s is not None and lease.ends_at_s <= at_s:
            return lease
        lease = lease.model_copy(update={"ends_at_s": at_s})
        self.leases[number] = lease
        return lease

    def of_job(self, job: str) -> list[DeviceLease]:
        return [self.leases[n] for n in self._by_job.get(job, ())]

    def on_offer(self, offer_id: str) -> Iterator[DeviceLease]:
        return (self.leases[n] for n in self._by_offer.get(offer_id, ()))

    def held(self, job: str) -> list[DeviceLease]:
        """The job's leases with no end set: devices it keeps (reservations included)."""
        return [lease for lease in self.of_job(job) if lease.ends_at_s is None]

    def preemptible(self, now_s: float) -> list[Preemptible]:
        """Running spot leases with no notice yet, on offers still posted."""
        found = []
        for lease in self.leases.values():
            offer = self.offers.get(lease.offer_id)
            if (offer is not None and lease.tenancy is Tenancy.spot
                    and lease.ends_at_s is None and lease.start_s <= now_s):
                found.append(Preemptible(lease, offer))
        return found
