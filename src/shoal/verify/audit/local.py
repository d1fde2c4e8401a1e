"""Auditing a step under DiLoCo, where each worker steps its own replica inside
a round and only the round's pseudo-gradient reaches the shared model.

A record of such a step (`LocalStep`) claims the state the worker's step
started from (parameters and optimizer state, both kept by the worker), the
gradient it computed, and where the step ended; the round's last step also
commits the weighted pseudo-gradient sent. The audit checks, cheapest first:

1. the kept start state is the committed one (else `bad_commitment`);
2. the start is where the worker's previous step of the round ended, or the
   round's agreed start (theta_outer, the state every member's first step of
   the round claims and the step's keepers saved); an optimizer state at a
   round's start must be one a recorded step ended with, or a fresh one (a
   worker that forges Adam's moments could steer its update anywhere while
   every replay passed): else `wrong_params`;
3. the gradient replays from the kept start (as every-step audits do);
4. the job's optimizer, from the kept state on that gradient, ends where the
   record says: bit for bit, or (another CPU may round a clipped norm
   differently) within the tolerance of the worker's next kept state;
5. at the round's last step, the pseudo-gradient is (theta_outer − end) ×
   round_samples / round_expected, within the tolerance, and those counts
   are the ones the worker's records of the round show.

The audit of any step also re-takes the worker's earlier steps of its round
(optimizer updates only, no forward or backward pass), from the round's
checked start on the committed gradients, and replays the step's own gradient
at the state that chain reached: a break anywhere in the chain, such as Adam
moments forged mid-round to steer every later update while each step replays
exactly, fails the round's end, and a gradient computed at a state of the
worker's choosing (kept and named as its start) fails its step. The re-take
first runs in one pass that hashes only the claims something relies on (the
audited step's end, a state another record starts from); where it does not
end bit for bit as claimed, it is redone step by step from the kept states,
checks 1, 2 and 4 at each step, which says where and lets honest rounding
through. The sampler puts each worker's round-end records first, each with
one of the worker's inner steps (`shoal.proof.sampling`): the re-take applies
committed gradients without replaying them, and a gradient itself (check 3)
is replayed where it is sampled, as in every-step jobs.

This module runs the chain; checks 1 and 2 live in `local_start`, 4 in
`step_end`, 5 in `round_end`, and theta_outer is found by `round_start`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.verify.audit.local_start import StartCheck
from shoal.verify.audit.round_end import RoundEnds
from shoal.verify.audit.round_start import RoundStarts, majority_claim
from shoal.verify.audit.slice import seeds_problem, slice_problem
from shoal.verify.audit.step_end import StepEnds
from shoal.verify.audit.walk import Finding, RoundWalk, opened_reveal
from shoal.train.hashing import optimizer_state_sha256, param_sha256
from shoal.verify.known_records import KnownRecords
from shoal.verify.proof_store import ProofStore
from shoal.verify.replay import JobSeeds, Replayer


@dataclass(frozen=True)
class Carried:
    """Where a step of the chain ended, bit for bit as claimed: the next one's start."""

    sha256: tuple[str, str]  # (parameters, optimizer state)
    state: dict  # the optimizer state (the replayer's model holds the parameters)


class LocalAudit:
    def __init__(self, store: ProofStore, replayer: Replayer, tolerance: float,
                 records: Callable[[], list[WorkRecord]]) -> None:
        """`records`: every record of the job so far (the store's, or a coordinator's)."""
        self.store, self.replayer, self.tolerance = store, replayer, tolerance
        self.records = records
        self.round_starts = RoundStarts(store, replayer)
        self.starts = StartCheck(store, replayer, self.round_starts)
        self.step_ends = StepEnds(store, replayer, tolerance)
        self.round_ends = RoundEnds(replayer, self.round_starts, tolerance)
        self._walk = RoundWalk(store, replayer)
        self._known: KnownRecords | None = None

    def known(self) -> KnownRecords:
        """Every record of the job so far, indexed (again only once they changed)."""
        self._known = KnownRecords.of(self.records(), self._known)
        return self._known

    def audit(self, record: WorkRecord, judge: Callable[[list[torch.Tensor]], Finding | None]
              ) -> Finding:
        """The finding on `record`; `judge` compares a replayed gradient with the
        revealed one (the every-step audit's hash-or-tolerance rule)."""
        claim = record.local
        assert claim is not None
        everyone = self.known()
        # theta_outer is the state most of the round's first-step records claim (one
        # writer cannot forge it). Its values come from the first kept start checked
        # against that claim (`StartCheck.kept_start`), or else the keepers' snapshot.
        outer_sha256 = majority_claim([r.params_sha256
                                       for r in everyone.of_step(claim.round_start)])
        if outer_sha256 is None:
            return (VerdictKind.unavailable,
                    f"no agreed parameters for the round starting at step {claim.round_start}", None)
        mine = everyone.of_worker(record.worker)
        # A step is audited with the worker's steps of its round before it: a worker
        # could break the chain (a forged optimizer state steers every later update)
        # and let every step replay exactly, or compute a gradient at a state of its
        # choosing and name that state as its step's start. Each earlier step's
        # optimizer update is re-taken on its committed gradient (cheap: no forward or
        # backward pass), and the step's own gradient replayed where that chain leads.
        # First in one pass that hashes only where a claim is needed (`audit_walk`);
        # where that does not end bit for bit as claimed, step by step from the kept
        # states (`_chain`, `_step`), which says what and where, within the tolerance.
        # Each verdict depends on its record's round alone, not on what else was audited.
        before = _round_before(record, mine)
        stated = self._stated_problems(before, everyone)
        walked = None
        if not stated:
            walked = self._walk.walk(
                before + [record], everyone,
                lambda step: self.starts.kept_start(step, mine, everyone, outer_sha256), judge)
        if walked is None:
            found, carried = self._chain(before, stated, mine, everyone, outer_sha256)
            if found is not None:
                return found
            found, _, walked = self._step(record, mine, everyone, outer_sha256, judge, carried)
            if found is not None:
                return found
        if claim.outer:
            return self.round_ends.problem(record, mine, everyone, outer_sha256, walked[-1])
        return VerdictKind.valid, "", 0.0

    def _chain(self, before: list[WorkRecord], stated: dict[int, Finding],
               mine: list[WorkRecord], everyone: KnownRecords, outer_sha256: str
               ) -> tuple[Finding | None, Carried | None]:
        """Re-take `before` (a worker's steps of a round, in order; `stated`: what
        `_stated_problems` found in them) step by step: each
        step's end hashed against its claim, and where one differs in its last bits,
        measured against the kept state that starts there (`StepEnds.problem`), the next
        going on from that. The first finding, and where the last step ended if bit for
        bit as claimed."""
        carried = None
        for earlier in before:
            found = stated.get(earlier.step)
            if found is None:
                # Where a step ends bit for bit as claimed, the next starts from that
                # state as it is (no file read, no start check left: the chain holds).
                found, carried, _ = self._step(earlier, mine, everyone, outer_sha256, None,
                                               carried)
            if found is not None:
                kind, detail, distance = found
                return (kind, f"step {earlier.step} of its round: {detail}", distance), None
        return None, carried

    def _stated_problems(self, before: list[WorkRecord], everyone: KnownRecords
                         ) -> dict[int, Finding]:
        """What is wrong with the seeds and slice of each step before the audited one (its
        own, its audit checked first), by step: its samples weigh its step's gradient and
        the round's pseudo-gradient, so each must be the job's seeds and the rank's
        slice, sampled or not."""
        found = {r.step: _stated_problem(r, everyone.of_step(r.step), self.replayer.seeds)
                 for r in before}
        return {step: problem for step, problem in found.items() if problem is not None}

    def _step(self, record: WorkRecord, mine: list[WorkRecord], everyone: KnownRecords,
              outer_sha256: str, judge: Callable[[list[torch.Tensor]], Finding | None] | None,
              carried: Carried | None) -> tuple[Finding | None, Carried | None, list[torch.Tensor]]:
        """One step of a worker's chain: its kept start, where it started, its committed
        gradient (replayed if `judge`), and where its optimizer update ended. Leaves the
        replayer's model at the step's end; returns the finding, what the next step may
        start from (the end, when it is bit for bit the claimed one) and the revealed
        contribution."""
        claim = record.local
        carried_here = carried is not None and \
            carried.sha256 == (record.params_sha256, claim.state_sha256)
        if carried_here:
            params, state = self.replayer.model.state_dict(), carried.state  # the model holds it
        else:
            found, kept = self.starts.kept_start(record, mine, everyone, outer_sha256)
            if found is not None:
                return found, None, []
            params, state = kept
        found, revealed = opened_reveal(self.store, record)
        if found is not None:
            return found, None, revealed
        gradients = revealed[:-1] if claim.outer else revealed
        if judge is not None:
            found = judge(gradients)  # from the model's state (the replay moves only .grad)
            if found is not None:
                return found, None, revealed
        if claim.applied:
            start = {k: v.clone() for k, v in params.items()}  # the step moves the model
            try:  # carried: the model holds the start already
                new_state = self.replayer.local_step(record, None if carried_here else params,
                                                     state, gradients)
            except (RuntimeError, KeyError, ValueError, IndexError):
                return (VerdictKind.wrong_params, "the optimizer state it started from is not "
                        "one of the job's optimizer", None), None, revealed
        else:
            start, new_state = params, state
        ended = (param_sha256(self.replayer.model), optimizer_state_sha256(new_state))
        if ended == (claim.end_params_sha256, claim.end_state_sha256):
            return None, Carried(ended, new_state), revealed
        return self.step_ends.problem(record, everyone, start, new_state), None, revealed


def _stated_problem(record: WorkRecord, of_step: list[WorkRecord],
                    seeds: JobSeeds | None) -> Finding | None:
    """A step's seeds and slice, as its own audit checks them against `of_step` (the
    step's records; a split they tie on is no verdict here: that step's own audit says
    so where it is sampled)."""
    wrong_seeds = seeds_problem(record, seeds)
    if wrong_seeds:
        return VerdictKind.wrong_params, wrong_seeds, None
    step_records = [r for r in of_step if r.membership_epoch == record.membership_epoch]
    found = slice_problem(record, step_records, seeds)
    return None if found is None or found[0] is VerdictKind.unavailable else found


def _round_before(record: WorkRecord, mine: list[WorkRecord]) -> list[WorkRecord]:
    """The worker's records of the steps of `record`'s round before it, in order."""
    return sorted((r for r in mine if r.local is not None and r.step < record.step
                   and r.local.round_start == record.local.round_start), key=lambda r: r.step)
