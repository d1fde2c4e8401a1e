"""Disputes over one worker's epoch: bisection to one step, then the referee
re-executes that single step (Truebit's bisection, Verde's refereed
delegation) and the loser pays through the contract.

Each party claims a trajectory: after each of the worker's steps in the
epoch, a running hash. The worker's (claimant's) trajectory folds in its
committed contributions; the challenger's folds in the same commitment
where its own replay accepts the step, and a fixed `rejected` mark where
it does not. So the two agree up to the first step the challenger rejects
and differ from there on, the bisection finds that step in ⌈log2 n⌉
rounds, and the referee's one replay decides which claim was true.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shoal.proof.bisection import Party, losers, play
from shoal.proof.errors import DisputeError
from shoal.spec.proof import Verdict, WorkRecord

REJECTED = "rejected"

# Judges one record of the disputed worker: True if its contribution is acceptable.
Judge = Callable[[WorkRecord], bool]


def trajectory(root: bytes, records: list[WorkRecord], accepts: Judge) -> list[str]:
    """The running hash after each record (index 0: before the first), where a step the
    judge does not accept folds in the `rejected` mark instead of its commitment."""
    state = hashlib.sha256(root + records[0].worker.encode()).hexdigest() if records else ""
    states = [state]
    for record in records:
        entry = record.contribution_sha256 if accepts(record) else REJECTED
        state = hashlib.sha256(f"{state}:{record.step}:{entry}".encode()).hexdigest()
        states.append(state)
    return states


@dataclass(frozen=True)
class DisputeResult:
    worker: str
    step: int | None  # the one step the referee re-executed
    rounds: int
    referee_verdict: Verdict | None
    upheld: bool  # the worker cheated at `step`: the challenger wins


def bisect_trajectories(root: bytes, records: list[WorkRecord], challenged: Sequence[str],
                        referee: Callable[[WorkRecord], Verdict]) -> DisputeResult:
    """A dispute where the challenger has committed to its whole trajectory (the states
    after each of `records`, in step order): the claimant's is its records'; the
    bisection narrows the two to one step, and the referee re-executes that step.

    A challenger trajectory that does not start where the claimant's does, or has
    another length, cannot be bisected: it loses (it disputes a claim nobody made)."""
    records = sorted(records, key=lambda r: r.step)
    claimed = trajectory(root, records, lambda r: True)
    worker = records[0].worker if records else ""
    if len(challenged) != len(claimed) or challenged[0] != claimed[0]:
        raise DisputeError(f"the challenger's trajectory has {len(challenged)} states from "
                           f"{challenged[0][:12] if challenged else '-'}; the worker's has "
                           f"{len(claimed)} from {claimed[0][:12]}: bisect the same records")
    if claimed[-1] == challenged[-1]:
        # The challenger accepts every step: there is nothing to dispute.
        return DisputeResult(worker, None, 0, None, upheld=False)
    outcome, rounds = play(0, len(records), lambda i: claimed[i], lambda i: challenged[i])
    step_record = records[outcome.step - 1]  # the record that leads to state outcome.step
    verdict = referee(step_record)
    entry = REJECTED if verdict.guilty else step_record.contribution_sha256
    recomputed = hashlib.sha256(f"{outcome.from_state}:{step_record.step}:{entry}".encode()).hexdigest()
    lost = losers(outcome, recomputed)
    return DisputeResult(step_record.worker, step_record.step, rounds, verdict,
                         upheld=Party.claimant in lost and Party.challenger not in lost)
