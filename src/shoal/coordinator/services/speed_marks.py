"""Holding offers to what they show: an offer's speed is its agent's own
pre-flight, so a provider could inflate it; the job's workers measure the
truth. Speeds of different workloads are not comparable, but ratios are:
each worker's job speed over its offer's speed is an index, the honest
majority sets the reference (the upper median), and an offer well below
it is marked down to the speed it showed."""

from __future__ import annotations

TOLERANCE = 0.6  # an index under this share of the reference is not noise


def marked_down(claimed: dict[str, float], observed: dict[str, float],
                tolerance: float = TOLERANCE) -> dict[str, float]:
    """Offer id → the speed to mark it down to, for offers that fall short of their claim.

    `claimed` is each offer's speed in the market; `observed` the job speed of
    the worker on it. Fewer than two workers give no reference: nothing is marked.
    """
    index = {offer: observed[offer] / claimed[offer] for offer in observed
             if claimed.get(offer, 0) > 0 and observed[offer] > 0}
    if len(index) < 2:
        return {}
    ranked = sorted(index.values())
    reference = ranked[len(ranked) // 2]
    return {offer: claimed[offer] * value / reference for offer, value in index.items()
            if value < tolerance * reference}
