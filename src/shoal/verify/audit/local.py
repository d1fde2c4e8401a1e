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
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.verify.audit.sent import sent_problem
from shoal.verify.audit.slice import seeds_problem, slice_problem
from shoal.verify.audit.walk import Finding, RoundWalk, opened_reveal
from shoal.train.hashing import optimizer_state_sha256, param_sha256
from shoal.verify.known_records import KnownRecords
from shoal.verify.proof_store import ProofStore, UnreadableFile
from shoal.verify.replay import JobSeeds, Replayer, relative_distance



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
        self._rounds: dict[int, tuple[str, torch.Tensor] | None] = {}
        self._fresh_sha256: str | None = None
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
        # against that claim (`_kept_start`), or else the keepers' snapshot.
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
                lambda step: self._kept_start(step, mine, everyone, outer_sha256), judge)
        if walked is None:
            found, carried = self._chain(before, stated, mine, everyone, outer_sha256)
            if found is not None:
                return found
            found, _, walked = self._step(record, mine, everyone, outer_sha256, judge, carried)
            if found is not None:
                return found
        if claim.outer:
            return self._outer_problem(record, mine, everyone, outer_sha256, walked[-1])
        return VerdictKind.valid, "", 0.0

    def _chain(self, before: list[WorkRecord], stated: dict[int, Finding],
               mine: list[WorkRecord], everyone: KnownRecords, outer_sha256: str
               ) -> tuple[Finding | None, Carried | None]:
        """Re-take `before` (a worker's steps of a round, in order; `stated`: what
        `_stated_problems` found in them) step by step: each
        step's end hashed against its claim, and where one differs in its last bits,
        measured against the kept state that starts there (`_end_problem`), the next
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

    def _kept_start(self, record: WorkRecord, mine: list[WorkRecord],
                    everyone: KnownRecords, outer_sha256: str
                    ) -> tuple[Finding | None, tuple[dict, dict] | None]:
        """The state the step started from as its worker kept it, checked: the committed
        one, and one its chain or the round's start allows (`_start_problem`)."""
        try:
            kept = self.store.load_local(record.worker, record.step)
        except UnreadableFile as error:
            return (VerdictKind.bad_commitment, f"the kept start state is not a state: {error}",
                    None), None
        if kept is None:
            return (VerdictKind.withheld, "the state the step started from is not kept", None), None
        params, state = kept
        try:  # the worker wrote it: a state shaped for another model is not the committed one
            self.replayer.load(params)
        except (RuntimeError, KeyError, ValueError):
            return (VerdictKind.bad_commitment, "the kept start state is not the committed one",
                    None), None
        if param_sha256(self.replayer.model) != record.params_sha256 or \
                optimizer_state_sha256(state) != record.local.state_sha256:
            return (VerdictKind.bad_commitment, "the kept start state is not the committed one",
                    None), None
        broken = self._start_problem(record, mine, everyone, outer_sha256)
        if broken:
            return (VerdictKind.wrong_params, broken, None), None
        if record.params_sha256 == outer_sha256 and record.local.round_start not in self._rounds:
            self._rounds[record.local.round_start] = (outer_sha256,
                                                      self.replayer.flat_params().clone())
        return None, kept

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
            found, kept = self._kept_start(record, mine, everyone, outer_sha256)
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
        return self._end_problem(record, everyone, start, new_state), None, revealed

    # -- the checks ------------------------------------------------------------------

    def round_start_params(self, round_start: int, everyone: KnownRecords
               ) -> tuple[str, torch.Tensor] | None:
        """theta_outer of a round: the keepers' snapshot, if it is what most of the
        round's first-step records claim (one writer cannot forge it). Kept once found;
        a snapshot not fetched yet is looked for again next time."""
        if round_start in self._rounds:
            return self._rounds[round_start]
        sha256 = load_agreed(self.store, self.replayer, round_start,
                             [r.params_sha256 for r in everyone.of_step(round_start)])
        if sha256 is None:
            return None
        self._rounds[round_start] = (sha256, self.replayer.flat_params().clone())
        return self._rounds[round_start]

    def _start_problem(self, record: WorkRecord, mine: list[WorkRecord],
                       everyone: KnownRecords, outer_sha256: str) -> str:
        """Why the step's start is not one the worker's chain of steps reached, or ""."""
        claim = record.local
        start = (record.params_sha256, claim.state_sha256)
        before = [r for r in mine if r.step == record.step - 1 and r.local is not None
                  and r.local.round_start == claim.round_start]
        if record.step > claim.round_start and any(
                start == (r.local.end_params_sha256, r.local.end_state_sha256)
                # A round's last step that the guard skipped is undone: the round goes
                # on from where that step started (had it been applied, a new round
                # would have begun from a new theta_outer).
                or (r.local.outer and start == (r.params_sha256, r.local.state_sha256))
                for r in before):
            return ""
        if record.params_sha256 != outer_sha256:
            return ("the step started neither where the worker's previous step of the round "
                    "ended nor at the round's agreed parameters")
        # At the round's agreed parameters: a fresh optimizer, or the state a step just
        # before left (the previous round's end: its own, or the peer's it joined from or
        # restored). Back there inside a round (a rollback, a join, a restore), also what
        # any earlier round's end left: a rollback goes back to a snapshot, which may be
        # rounds old. Not at a round's start: an old Adam state would push a round along
        # old gradients.
        restart = record.step > claim.round_start
        if self.may_start_from(claim.state_sha256, record.step, everyone, restart=restart):
            return ""
        return ("the optimizer state it started from is not one the previous round's end left"
                if not restart else "the optimizer state it started from is not one a step "
                "just before or a round's end left")

    def may_start_from(self, state_sha256: str, step: int, everyone: KnownRecords, *,
                       restart: bool) -> bool:
        """May a step at theta_outer start from this optimizer state: a fresh one, one a
        record of the step just before ended with, or (a `restart` inside a round) one
        any earlier round's end left?"""
        if state_sha256 == self.fresh_state_sha256():
            return True
        return any(r.step == step - 1 or (restart and r.local.outer and r.step < step)
                   for r in everyone.ending_at(state_sha256))

    def fresh_state_sha256(self) -> str:
        if self._fresh_sha256 is None:
            self._fresh_sha256 = optimizer_state_sha256(self.replayer.fresh_optimizer_state())
        return self._fresh_sha256

    def _end_problem(self, record: WorkRecord, everyone: KnownRecords, start: dict,
                     new_state: dict) -> Finding | None:
        """Does the optimizer step end where the record claims? Bit for bit, or within
        the tolerance of the claimed end as kept for a later step: the worker's own next
        one, or else a peer's that started from the claimed optimizer state.

        Peers count: a worker that claims an end it never reached and goes on from its
        true state, while a colluding peer starts from the claim (its next round, or a
        restart at theta_outer), would otherwise leave nothing to measure against
        (`unavailable`, no verdict). Each kept file must be the state its record claims:
        a peer's that is not cannot speak for or against this worker (one keeping the
        true end under the forged claim's name would clear it), and the worker's own that
        is not is its own broken commitment."""
        claim = record.local
        for later in next_kept_starts(record, everyone):
            try:
                kept = self.store.load_local(later.worker, later.step)
            except UnreadableFile:
                if later.worker == record.worker:
                    return (VerdictKind.bad_commitment, f"the state its step {later.step} "
                            "started from is not a state", None)
                continue  # a peer's broken file speaks for nobody
            if kept is None:
                continue
            next_params, next_state = kept
            if optimizer_state_sha256(next_state) != claim.end_state_sha256:
                if later.worker == record.worker:
                    return (VerdictKind.bad_commitment, f"the state its step {later.step} "
                            "started from is not the one its records claim", None)
                continue
            distance = relative_distance(state_tensors(new_state), state_tensors(next_state))
            if not claim.outer and later.worker == record.worker:  # the parameters go on too
                moved = self.replayer.flat_params()
                names = _trainable(self.replayer.model)
                base = torch.cat([start[k].reshape(-1) for k in names])
                there = torch.cat([next_params[k].reshape(-1) for k in names])
                distance = max(distance, relative_distance([moved - base], [there - base]))
            if distance <= self.tolerance:
                return None
            return (VerdictKind.wrong_contribution,
                    "the optimizer step does not end where the record says", distance)
        return (VerdictKind.unavailable,
                "the step's end differs in its last bits and no later step's state that "
                "starts there is kept to measure by how much", None)

    def _outer_problem(self, record: WorkRecord, mine: list[WorkRecord],
                       everyone: KnownRecords, outer_sha256: str,
                       pseudo: torch.Tensor) -> Finding:
        """The round's end (the model holds where its last step ended): is the committed
        `pseudo`-gradient (theta_outer − that) weighted by the samples its records show?"""
        claim = record.local
        outer = self._rounds.get(claim.round_start)
        if outer is None or outer[0] != outer_sha256:  # no kept start at it was read here
            end = {k: v.clone() for k, v in self.replayer.model.state_dict().items()}
            outer = self.round_start_params(claim.round_start, everyone)
            self.replayer.load(end)
            if outer is None:
                return (VerdictKind.unavailable, "no agreed parameters for the round starting "
                        f"at step {claim.round_start}", None)
        outer_flat = outer[1]
        samples, expected = _round_counts(record, mine, everyone, outer_sha256)
        if (claim.round_samples, claim.round_expected) != (samples, expected):
            return (VerdictKind.wrong_samples,
                    f"claims {claim.round_samples} of {claim.round_expected} samples for its "
                    f"pseudo-gradient; its records of the round show {samples} of {expected}", None)
        honest = (outer_flat - self.replayer.flat_params()) * (samples / expected)
        distance = relative_distance([honest], [pseudo])
        if distance > self.tolerance:
            return VerdictKind.wrong_contribution, "the pseudo-gradient is not the round's", distance
        # ... and it is what the worker put in the outer exchange, with that count.
        found = sent_problem(record, everyone.of_step(record.step), [pseudo],
                             self.tolerance, count=claim.round_samples)
        return found if found is not None else (VerdictKind.valid, "", distance)


def load_agreed(store: ProofStore, replayer: Replayer, step: int,
                claims: list[str]) -> str | None:
    """Load the keepers' snapshot of `step` into the replayer if it is the state most of
    the step's records `claims` to start from (one writer cannot forge it); its SHA-256,
    or None when there is no such snapshot. As many claims for another state as for the
    snapshot's is no majority: in a step of two, a cheat's forged claim against its
    peer's cannot be told apart, and whichever record is listed first must not decide."""
    state = store.load_params(step)
    if state is None or not claims:
        return None
    try:
        replayer.load(state)
    except (RuntimeError, KeyError):
        return None
    sha256 = param_sha256(replayer.model)
    return sha256 if sha256 == majority_claim(claims) else None


def majority_claim(claims: list[str]) -> str | None:
    """The state more of a step's records claim to start from than any other, or None
    (no claims, or a tie: one claim against another decides nothing). The coordinator
    checks a keeper's answer by the same rule, so it refuses nothing a verifier takes."""
    ranked = collections.Counter(claims).most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


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


def _round_counts(record: WorkRecord, mine: list[WorkRecord], everyone: KnownRecords,
                  outer_sha256: str) -> tuple[int, int]:
    """(samples behind this worker's pseudo-gradient, samples of the round's steps) as
    `DiLoCo` counts them: a step back at theta_outer after the round's start (a
    rollback, a join) drops this worker's samples before it; an earlier end of the
    round that the guard skipped counts nowhere. A step the worker has no record of
    (it joined mid-round) is counted as most of its records say; where it has one, its
    own says (a peer's record cannot move it)."""
    claim = record.local

    def of_round(records: Iterable[WorkRecord]) -> list[WorkRecord]:
        return [r for r in records if r.local is not None and r.local.round_start ==
                claim.round_start and claim.round_start <= r.step <= record.step]

    own = {r.step: r for r in of_round(mine)}
    others: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in of_round(r for step in range(claim.round_start, record.step + 1)
                      for r in everyone.of_step(step)):
        others[r.step][(r.global_batch, r.local.outer)] += 1
    samples = expected = 0
    for step in range(claim.round_start, record.step + 1):
        r = own.get(step)
        if r is not None:
            batch, skipped = r.global_batch, r.local.outer and step != record.step
        elif others[step]:
            batch, outer = others[step].most_common(1)[0][0]
            skipped = outer
        else:
            continue  # nobody recorded it
        if skipped:
            continue
        expected += batch
        if r is not None:
            if step > claim.round_start and r.params_sha256 == outer_sha256:
                samples = 0
            samples += r.samples if r.local.applied else 0
    return samples, expected


def next_kept_starts(record: WorkRecord, everyone: Iterable[WorkRecord]) -> list[WorkRecord]:
    """The later records that start where `record` claims its step ended, in the order
    an audit measures against them: the worker's own next (at the claimed parameters and
    optimizer state; after a round's end, the state alone, the parameters going to the
    outer step), then peers' that started from the claimed optimizer state (a joiner's,
    or a restart at theta_outer), in step order."""
    claim = record.local
    own = [r for r in everyone if r.worker == record.worker and r.step > record.step
           and r.local is not None and r.local.state_sha256 == claim.end_state_sha256
           and (claim.outer or r.params_sha256 == claim.end_params_sha256)]
    peers = [r for r in everyone if r.worker != record.worker and r.step > record.step
             and r.local is not None and r.local.state_sha256 == claim.end_state_sha256]
    return sorted(own, key=lambda r: r.step) + sorted(peers, key=lambda r: (r.step, r.worker))


def state_tensors(state: dict) -> list[torch.Tensor]:
    """An optimizer state's tensors in a fixed order (parameter, then name)."""
    return [state[i][name].detach().reshape(-1).double() for i in sorted(state)
            for name in sorted(state[i]) if isinstance(state[i][name], torch.Tensor)]


def _trainable(model: torch.nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]
