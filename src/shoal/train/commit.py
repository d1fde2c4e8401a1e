"""Step commit: a step whose exchange failed anywhere is applied by nobody.

After the all-reduce every rank adds its vote to one counter in the store
(1 for success, 1 + FAILED for failure). The rank whose vote completes the
count writes the decision with compare-and-set; the others wait for it. A
step commits only if all members voted and none failed. If a member is
dropped by the authority before voting, the survivors propose to discard:
the step is redone by whoever is left, so nothing is lost, and since every
decision goes through compare-and-set, every rank follows the same one.

The decision also carries the switch to a newer epoch (join, leave) and
new share weights, so all ranks change together at the same step boundary.
Three store round trips per step in the common case.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.spec.elastic import MembershipEpoch, StepDecision
from shoal.train.rendezvous import Rendezvous

FAILED = 1 << 20  # a failure vote; counts stay below it (worlds are far smaller)


class Excluded(Exception):
    """This worker is no longer a member (it was fenced while stalled)."""


def agree(rdzv: Rendezvous, epoch: MembershipEpoch, rank: int, step: int, ok: bool, *,
          poll_s: float, weights: Callable[[], tuple[float, ...] | None]) -> StepDecision:
    """Vote `ok` for `step` and return the decision every rank will follow."""
    e, world = epoch.epoch, len(epoch.members)
    total = rdzv.add_vote(e, step, 1 if ok else 1 + FAILED)
    if total % FAILED == world:  # this vote completed the count: decide for everyone
        commit = total < FAILED
        latest = rdzv.latest_epoch()
        proposal = StepDecision(commit=commit, next_epoch=latest if latest > e else None,
                                weights=weights() if commit else None)
        if not commit and latest == e:
            rdzv.request_reform(e)
        return rdzv.decide(e, step, proposal)
    while True:
        decided = rdzv.wait_decision(e, step, poll_s)
        if decided is not None:
            return decided
        latest = rdzv.latest_epoch()
        if latest > e:
            newest = rdzv.epoch(latest)
            if epoch.members[rank] not in newest.members:
                raise Excluded(f"dropped from the membership in epoch {latest}")
            if not set(epoch.members) <= set(newest.members):
                # A member left without voting: the survivors redo this step.
                return rdzv.decide(e, step, StepDecision(commit=False, next_epoch=latest))
