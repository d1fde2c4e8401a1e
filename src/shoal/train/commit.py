"""Step commit: a step whose exchange failed anywhere is applied by nobody.

After the all-reduce each rank votes in the store; once every live member
has voted (a member the authority dropped no longer counts), the first
rank to get there writes the decision with compare-and-set and every rank
reads that same decision. The decision also carries the switch to a newer
epoch (join, leave) and new share weights, so all ranks change together
at the same step boundary.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.spec.elastic import MembershipEpoch, StepDecision
from shoal.train.rendezvous import Rendezvous


class Excluded(Exception):
    """This worker is no longer a member (it was fenced while stalled)."""


def agree(rdzv: Rendezvous, epoch: MembershipEpoch, rank: int, step: int, ok: bool, *,
          poll_s: float, weights: Callable[[], tuple[float, ...] | None]) -> StepDecision:
    """Vote `ok` for `step` and return the decision every rank will follow."""
    e = epoch.epoch
    rdzv.vote(e, step, rank, ok)
    live = list(range(len(epoch.members)))
    while True:
        if rdzv.wait_keys([rdzv.vote_key(e, step, r) for r in live], poll_s):
            commit = all(rdzv.votes(e, step, live))
            latest = rdzv.latest_epoch()
            proposal = StepDecision(
                commit=commit,
                next_epoch=latest if latest > e else None,
                weights=weights() if commit else None,
            )
            if not commit and latest == e:
                rdzv.request_reform(e)
            return rdzv.decide(e, step, proposal)
        decided = rdzv.existing_decision(e, step)
        if decided is not None:
            return decided
        latest = rdzv.latest_epoch()
        if latest > e:
            newest = rdzv.epoch(latest)
            if epoch.members[rank] not in newest.members:
                raise Excluded(f"dropped from the membership in epoch {latest}")
            live = [r for r, m in enumerate(epoch.members) if m in newest.members]
