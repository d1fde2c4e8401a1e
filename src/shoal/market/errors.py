"""Errors of the market layer, one class per thing a caller can act on.

Every message names the value at fault and says what to change; the
coordinator turns these into 4xx answers and the CLI into one line.
"""

from __future__ import annotations

from shoal import ShoalError


class MarketError(ShoalError):
    """Root of the market's errors."""


class UnknownJob(MarketError):
    """A job the market has no bid for (never submitted, or finished)."""

    def __init__(self, job: str) -> None:
        super().__init__(f"no open bid for job '{job}'; submit a bid for it first")
        self.job = job


class UnknownOffer(MarketError):
    """An offer id the market has never been given."""

    def __init__(self, offer_id: str) -> None:
        super().__init__(f"no offer '{offer_id}'; post the offer before acting on it")
        self.offer_id = offer_id


class OfferNotYours(MarketError):
    """A provider tried to re-post or withdraw another provider's offer."""

    def __init__(self, offer_id: str, owner: str, caller: str) -> None:
        super().__init__(
            f"offer '{offer_id}' belongs to provider '{owner}', not '{caller}'; "
            "post your device under an offer id of your own"
        )


class OfferAboveReference(MarketError):
    """An offer priced above the on-demand price of its kind, under the reject policy."""

    def __init__(self, offer_id: str, price: int, reference: int | None, kind: str) -> None:
        if reference is None:
            hint = (f"device kind '{kind}' has no on-demand reference price; "
                    "add it to the price table or use a known kind")
        else:
            hint = (f"it asks {price} wei/s, above the on-demand {reference} wei/s "
                    f"for '{kind}'; ask at most {reference} wei/s")
        super().__init__(f"offer '{offer_id}' refused: {hint}")
        self.offer_id = offer_id


class BidConflict(MarketError):
    """A changed bid that would break terms its running leases were made under."""


class ClockWentBack(MarketError):
    """A time earlier than one the market has already acted on."""

    def __init__(self, now_s: float, last_s: float) -> None:
        super().__init__(
            f"time {now_s:.3f} s is before {last_s:.3f} s, which the market already acted on; "
            "pass one monotonic clock to every call"
        )


class JobFinished(MarketError):
    """An action on a job that has already finished and released its leases."""

    def __init__(self, job: str) -> None:
        super().__init__(f"job '{job}' has finished; submit a new job id to run again")
