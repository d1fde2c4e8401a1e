"""Step commit: a step whose exchange failed anywhere is applied by nobody.

After the all-reduce every rank adds its ballot to one counter in the
store: a count, plus a flag field each for a failed exchange, a guard
verdict (skip, rollback) and replicas found to differ. The rank whose
ballot completes the count writes the decision with compare-and-set; the
others wait for it. A step commits only if all members voted and none
failed; its guard verdict is the strictest any member reached. If a
member is dropped before voting (it died or stalled, not a spot notice it
gave), the survivors propose to discard: the step is redone by whoever is
left, so nothing is lost, and since every decision goes through
compare-and-set, every rank follows the same one.

The decision also carries the switch to a newer epoch (join, leave) and
new share weights, so all ranks change together at the same step boundary.
Three store round trips per step in the common case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shoal.spec.elastic import GuardVerdict, MembershipEpoch, StepDecision
from shoal.train.rendezvous import EPOCH_LOOK_S, Rendezvous

# Fields of the ballot counter: each holds a count below 2**10 (worlds are far smaller).
_FIELD = 1 << 10
_COUNT, FAILED, SKIP, ROLLBACK, DIVERGED = (_FIELD ** i for i in range(5))


class Excluded(Exception):
    """This worker is no longer a member (it was fenced while stalled)."""


@dataclass(frozen=True)
class Ballot:
    ok: bool  # this rank's exchange succeeded
    verdict: GuardVerdict = GuardVerdict.apply  # its guard's assessment of the reduced step
    diverged: bool = False  # the exchanged replica fingerprints differ

    def value(self) -> int:
        flags = {GuardVerdict.skip: SKIP, GuardVerdict.rollback: ROLLBACK}.get(self.verdict, 0)
        return _COUNT + (0 if self.ok else FAILED) + flags + (DIVERGED if self.diverged else 0)


@dataclass(frozen=True)
class Proposer:
    """What the deciding rank asks of its run when it writes the decision."""

    weights: Callable[[], tuple[float, ...] | None]  # new share weights, if due
    resync_source: Callable[[], str]  # the member whose state all adopt after a divergence
    # True if the newest epoch dropped a member that gave no notice (died, stalled), or
    # one that gave notice and never finished its last step.
    lost_member: Callable[[MembershipEpoch], bool]


def _field(total: int, flag: int) -> int:
    return total // flag % _FIELD


def _propose(rdzv: Rendezvous, epoch: MembershipEpoch, total: int,
             proposer: Proposer) -> StepDecision:
    e = epoch.epoch
    diverged = _field(total, DIVERGED) > 0
    commit = _field(total, FAILED) == 0 and not diverged
    latest = rdzv.latest_epoch()
    verdict = (GuardVerdict.rollback if _field(total, ROLLBACK) else
               GuardVerdict.skip if _field(total, SKIP) else GuardVerdict.apply)
    source = proposer.resync_source() if diverged else None
    if diverged:
        rdzv.request_reform(e, state_source=source)
    elif not commit and latest == e:
        rdzv.request_reform(e)
    return StepDecision(commit=commit, next_epoch=latest if latest > e else None,
                        weights=proposer.weights() if commit else None,
                        verdict=verdict, resync_from=source)


def agree(rdzv: Rendezvous, epoch: MembershipEpoch, rank: int, step: int, ballot: Ballot, *,
          poll_s: float, proposer: Proposer, leaving: bool = False,
          waiting: Callable[[], None] = lambda: None) -> StepDecision:
    """Cast `ballot` for `step` and return the decision every rank will follow.

    `leaving`: this worker gave notice; a newer epoch without it is expected.
    `waiting`: called while the decision is awaited (liveness refresh).
    """
    e, world = epoch.epoch, len(epoch.members)
    total = rdzv.add_vote(e, step, ballot.value())
    if _field(total, _COUNT) == world:  # this ballot completed the count: decide for everyone
        return rdzv.decide(e, step, _propose(rdzv, epoch, total, proposer))
    while True:
        # The failure flag and the newest epoch: asked once per EPOCH_LOOK_S, not per poll.
        decided = rdzv.wait_decision(e, step, max(poll_s, EPOCH_LOOK_S))
        if decided is not None:
            return decided
        waiting()
        rdzv.check_failed()
        latest = rdzv.latest_epoch()
        if latest > e:
            newest = rdzv.epoch(latest)
            if epoch.members[rank] not in newest.members and not leaving:
                raise Excluded(f"dropped from the membership in epoch {latest}")
            if proposer.lost_member(newest):
                # A member is gone without voting: the survivors redo this step.
                return rdzv.decide(e, step, StepDecision(commit=False, next_epoch=latest))
