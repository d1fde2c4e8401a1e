"""Values of the compute market: offers, bids, device leases, notices, prices.

Money is integer wei (a float would lose wei, and the ledger books integers);
times are float seconds on the caller's clock, named `_s`. The market layer
decides; these values only carry what it decided across to the coordinator.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, model_validator

from shoal.spec.job import Frozen

Name = Annotated[str, Field(min_length=1, max_length=128)]
Wei = Annotated[int, Field(ge=0)]
PricePerSecond = Annotated[int, Field(ge=1)]  # a free device would win every auction for nothing
BPS = 10_000  # basis points in one whole


class Tenancy(str, enum.Enum):
    """How a device is held: spot may be taken back (with notice), on-demand never."""

    spot = "spot"
    on_demand = "on_demand"


class Offer(Frozen):
    """One device a provider offers, at the price it asks, for any job that fits."""

    offer_id: Name  # stable across re-posts; the provider may change its terms
    provider: Name
    device_kind: Name  # a key of the on-demand price table, e.g. "h100-80g"
    speed_samples_per_s: float = Field(gt=0.0)  # measured by the agent's pre-flight, not claimed
    memory_gb: float = Field(gt=0.0)
    region: Name
    price_wei_per_s: PricePerSecond
    tenancy: Tenancy = Tenancy.spot
    torch: str | None = None  # the torch release its workers run on (the agent's pre-flight)


class Bid(Frozen):
    """A job's request to the market: how many devices, of what, at most at what price."""

    job: Name
    workers: int = Field(ge=1, le=100_000)  # devices wanted
    # Fewest devices the job can run with; below it nothing new is leased
    # (a half-formed job would pay for devices it cannot use).
    min_workers: int = Field(1, ge=1, le=100_000)
    min_speed_samples_per_s: float = Field(0.0, ge=0.0)
    min_memory_gb: float = Field(0.0, ge=0.0)
    regions: frozenset[Name] = frozenset()  # empty: any region
    tenancies: frozenset[Tenancy] = frozenset(Tenancy)  # spot only: {"spot"}
    max_price_wei_per_s: PricePerSecond  # per device, never exceeded by any lease
    budget_wei: Wei  # escrowed for this job; billing stops before it is exceeded
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    # At most this many of the job's devices from one provider (None: no cap). A job
    # that settles on a chain gets 1: the contract holds one lease per job and
    # provider, booked for at most the time since it was accepted, so a second device
    # of the provider would work unpaid.
    max_devices_per_provider: int | None = Field(None, ge=1, le=100_000)
    # Only devices running this torch release (a bundled job: the release its script was
    # written against; None: any, the built-in trainer runs on each).
    torch: str | None = None

    @model_validator(mode="after")
    def _min_fits(self) -> Bid:
        if self.min_workers > self.workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) must not exceed workers ({self.workers})"
            )
        if not self.tenancies:
            raise ValueError("tenancies must name at least one of 'spot', 'on_demand'")
        return self


class DeviceLease(Frozen):
    """One offered device leased to one job, at the price asked when it was leased.

    `price_wei_per_s` is fixed for the life of the lease: a provider that
    re-posts its offer at another price changes only future leases.
    """

    lease: int = Field(ge=1)  # numbered by the market, in the order leases were made
    job: Name
    offer_id: Name
    provider: Name
    device_kind: Name
    region: Name
    speed_samples_per_s: float = Field(gt=0.0)
    memory_gb: float = Field(gt=0.0)
    tenancy: Tenancy
    priority: int  # the job's priority when leased: what preemption compares
    price_wei_per_s: PricePerSecond
    reference_wei_per_s: int | None = Field(None, ge=1)  # on-demand price of the kind, if known
    start_s: float  # billing starts here (later than the lease's making after a preemption)
    ends_at_s: float | None = None  # None while open-ended; set on finish, notice or release

    @property
    def spot(self) -> bool:
        return self.tenancy is Tenancy.spot

    @property
    def discount_bps(self) -> int | None:
        """Saving against on-demand in basis points (negative: a premium); None if unreferenced."""
        if self.reference_wei_per_s is None:
            return None
        saved = self.reference_wei_per_s - self.price_wei_per_s
        return saved * BPS // self.reference_wei_per_s


class PreemptionNotice(Frozen):
    """A spot lease taken back for a higher-priority job, effective after a notice period."""

    lease: DeviceLease  # the victim, as it was before the notice
    by_job: Name
    by_priority: int
    issued_at_s: float
    ends_at_s: float  # the victim bills until here; the new holder from here


class ReferencePrice(Frozen):
    """What a cloud charges on demand for one device of a kind."""

    device_kind: Name
    on_demand_wei_per_s: PricePerSecond


class PriceTable(Frozen):
    """The on-demand price index that offers are measured against."""

    prices: tuple[ReferencePrice, ...] = ()

    @model_validator(mode="after")
    def _kinds_unique(self) -> PriceTable:
        kinds = [p.device_kind for p in self.prices]
        twice = sorted({k for k in kinds if kinds.count(k) > 1})
        if twice:
            raise ValueError(f"device kinds listed twice in the price table: {twice}")
        return self

    def on_demand_wei_per_s(self, device_kind: str) -> int | None:
        for price in self.prices:
            if price.device_kind == device_kind:
                return price.on_demand_wei_per_s
        return None


class FillStatus(str, enum.Enum):
    full = "full"  # holds every worker it wants
    partial = "partial"  # at least min_workers, fewer than workers
    unfilled = "unfilled"  # below min_workers: nothing new was leased
    paused = "paused"  # not in the auction: paused, out of escrow or finished


class JobFill(Frozen):
    """What one clearing round did for one job, and why, in words the submitter can act on."""

    job: Name
    status: FillStatus
    held: int = Field(ge=0)  # open leases after the round (reservations included)
    new_leases: tuple[DeviceLease, ...] = ()
    notices: tuple[PreemptionNotice, ...] = ()  # issued to others so this job could start
    reason: str = ""
