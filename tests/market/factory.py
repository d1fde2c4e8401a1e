"""Small builders of offers and bids for the market tests, and Hypothesis strategies."""

from __future__ import annotations

from hypothesis import strategies as st

from shoal.spec.market import Bid, Offer, PriceTable, ReferencePrice, Tenancy

KINDS = ("a100", "h100", "l4")
REGIONS = ("eu", "us", "ap")
# On-demand prices per device kind, wei per second.
TABLE = PriceTable(prices=tuple(ReferencePrice(device_kind=k, on_demand_wei_per_s=p)
                                for k, p in (("a100", 900), ("h100", 1_000), ("l4", 300))))


def offer(offer_id: str, price: int = 100, *, provider: str | None = None, kind: str = "h100",
          speed: float = 10.0, memory: float = 80.0, region: str = "eu",
          tenancy: Tenancy = Tenancy.spot) -> Offer:
    return Offer(offer_id=offer_id, provider=provider or f"prov-{offer_id}", device_kind=kind,
                 speed_samples_per_s=speed, memory_gb=memory, region=region,
                 price_wei_per_s=price, tenancy=tenancy)


def bid(job: str, workers: int = 1, *, max_price: int = 1_000, budget: int = 10**9,
        priority: int = 0, **more: object) -> Bid:
    return Bid(job=job, workers=workers, max_price_wei_per_s=max_price, budget_wei=budget,
               priority=priority, **more)


@st.composite
def offers(draw: st.DrawFn, max_size: int = 8) -> list[Offer]:
    """Offers with distinct ids; prices on a coarse grid so ties happen often."""
    n = draw(st.integers(0, max_size))
    return [offer(f"o{i}", draw(st.integers(1, 12)) * 50,
                  kind=draw(st.sampled_from(KINDS)),
                  speed=float(draw(st.integers(1, 4)) * 5),
                  memory=float(draw(st.sampled_from([24, 40, 80]))),
                  region=draw(st.sampled_from(REGIONS)),
                  tenancy=draw(st.sampled_from(list(Tenancy))))
            for i in range(n)]


@st.composite
def bids(draw: st.DrawFn, job: str = "job", max_workers: int = 4) -> Bid:
    workers = draw(st.integers(1, max_workers))
    return bid(job, workers,
               min_workers=draw(st.integers(1, workers)),
               max_price=draw(st.integers(1, 12)) * 50,
               priority=draw(st.integers(0, 3)),
               min_speed_samples_per_s=float(draw(st.integers(0, 3)) * 5),
               min_memory_gb=float(draw(st.sampled_from([0, 40, 80]))),
               regions=frozenset(draw(st.sets(st.sampled_from(REGIONS), max_size=2))),
               tenancies=draw(st.sampled_from([frozenset(Tenancy), frozenset({Tenancy.spot}),
                                               frozenset({Tenancy.on_demand})])))
