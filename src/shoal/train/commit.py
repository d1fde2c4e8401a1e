"""Step commit, as a member takes part in it: a step whose exchange failed anywhere
is applied by nobody.

After the exchange every member casts its ballot under a key of its own
(`vote/E/K/W`: did its exchange work, what its guard says, its replica
fingerprint) and waits for the step's decision, which the membership authority
alone writes once every member has voted (shoal.elastic.decider): a step
commits only if every member voted and none failed, with the strictest guard
verdict any member reached; replicas whose fingerprints differ discard it and
all adopt the most common state. If a member is dropped before voting (it died
or stalled, not a spot notice it gave), the authority discards the step: the
survivors redo it, so nothing is lost. No member can decide for the others,
name a resync's state source, or say that another member failed: each ballot
is its member's own (issue 40, point 6).

The decision also carries the switch to a newer epoch (join, leave) and new
share weights, so all members change together at the same step boundary. The
ballot is sent and never answered; the decision is one round trip through a
market job's gate, which holds the read until it is written (two to a store
with no gate: the wait, then the read).
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.spec.elastic import MembershipEpoch, StepBallot, StepDecision
from shoal.train.rendezvous import Rendezvous

# A member waiting for a decision blocks in the store this long at a time, then
# refreshes its progress point and looks for the run's failure: decisions come within
# milliseconds of the last ballot, so a wait runs out only while a peer is slow or lost
# (and torch's timed-wait race, Rendezvous.wait_keys, needs the decision to land just as
# one runs out). Well inside the liveness floor, so a waiting member never looks silent.
DECISION_WAIT_S = 0.25


def agree(rdzv: Rendezvous, epoch: MembershipEpoch, worker: str, index: int,
          ballot: StepBallot, *, waiting: Callable[[], None] = lambda: None) -> StepDecision:
    """Cast `worker`'s ballot on the epoch's `index`-th voted step and return the
    decision every member follows. `waiting`: called while it is awaited (liveness)."""
    rdzv.vote(epoch.epoch, index, worker, ballot)
    while True:
        decided = rdzv.wait_decision(epoch.epoch, index, DECISION_WAIT_S)
        if decided is not None:
            return decided
        waiting()
        rdzv.check_failed()
