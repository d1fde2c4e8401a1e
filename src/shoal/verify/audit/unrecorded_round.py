"""Auditing a DiLoCo round whose end its worker filed no record of.

Under DiLoCo a round's pseudo-gradient is where the worker's own inner steps
ended, from theta_outer and the worker's own optimizer state. A worker that
poisons it and files no record has committed to nothing, but (as under
every-step sync, `shoal.verify.audit.unrecorded`) its peers' records say what
it declared, and it keeps the state each of its steps started from
(`local/WORKER/STEP.safetensors`, for the challenge window). So the round is replayed
step by step from those kept states, each step's samples being its rank's
slice of the step as its peers' records split it:

- the round's first state must be theta_outer (the keepers' snapshot the
  round's records agree on) with an optimizer state that is fresh, one a
  record of the step just before ended with (the previous round's end), or
  the end of the worker's previous round as this audit replayed it (a worker
  whose earlier rounds have no record either: that round is replayed first,
  back to a state a record or a fresh start vouches for);
- each step's replay (gradient and the job's optimizer step) must end where
  the worker's next kept state starts, within the tolerance; the same state
  again is a step its own guard skipped, and a start back at theta_outer a
  restart (a rollback, a join), as the runtime does;
- the last step's end gives the pseudo-gradient, (theta_outer − end) ×
  samples / the round's samples, and its sketch and samples count must be
  what the worker declared in the outer exchange, its loss report the
  replay's.

A kept state the worker cannot show is `withheld`. Each state is checked
from the worker's own kept start, so honest rounding does not add up along
the chain. A worker that was not a member at every step of the round (it
joined inside it) is not judged here: `unavailable`.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

from shoal.proof.epochs import final_lineage
from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.verify.audit.local import LocalAudit
from shoal.verify.audit.step_end import state_tensors
from shoal.verify.audit.walk import Finding
from shoal.verify.audit.sent import Declaration, declared_distance, loss_problem
from shoal.verify.audit.unrecorded import UNRECORDED, Members, Unrecorded, stand_in
from shoal.train.hashing import optimizer_state_sha256, param_sha256
from shoal.verify.known_records import KnownRecords
from shoal.verify.proof_store import ProofStore, UnreadableFile
from shoal.verify.replay import Replayer, relative_distance

# Rounds replayed back from the audited one to reach a state something vouches for: a
# worker whose records of every round are lost costs at most this many rounds per audit
# (the verifier remembers each round's end it replayed, so auditing rounds in order
# replays each once).
MAX_ROUNDS_BACK = 64


@dataclass
class _Replayed:
    """One step of the chain as replayed from the worker's kept start."""

    start: tuple[str, str]  # (parameters, optimizer state) SHA-256 of the kept start
    start_flat: torch.Tensor  # its trainable parameters, and where the step moved them
    end_flat: torch.Tensor
    end_state: dict
    share: int  # its samples (counted once the next state shows the step was taken)


@dataclass(frozen=True)
class RoundEnd:
    """A record-less round replayed to its end: what the next round may start from."""

    end_state: dict
    pseudo: torch.Tensor
    samples: int
    record: WorkRecord  # the stand-in of the round's last step


class UnrecordedRounds:
    def __init__(self, store: ProofStore, replayer: Replayer, tolerance: float,
                 local: LocalAudit, members: Members) -> None:
        self.store, self.replayer, self.tolerance = store, replayer, tolerance
        self.local, self.members = local, members
        # (worker, step) -> the optimizer state SHA-256 its kept start at that round's
        # start was found to continue (a previous round's replayed end).
        self._vouched: dict[tuple[str, int], str] = {}

    def judge(self, share: Unrecorded, step_records: list[WorkRecord]) -> Finding:
        """The finding on `share`: the end of a DiLoCo round (a voted step) whose worker
        filed no record there. `step_records`: the step's final lineage."""
        assert share.worker is not None, "only a share whose worker is known is judged"
        everyone = self.local.known()
        lineage: dict[int, list[WorkRecord]] = collections.defaultdict(list)
        for record in final_lineage(everyone.all):
            lineage[record.step].append(record)
        lineage[share.step] = list(step_records)
        found = self._round(share.worker, share.step, lineage, everyone, MAX_ROUNDS_BACK)
        if not isinstance(found, RoundEnd):
            kind, detail, distance = found
            return kind, f"{UNRECORDED}; {detail}", distance
        measured = declared_distance(found.record, step_records, [found.pseudo], self.tolerance)
        if not isinstance(measured[0], Declaration):
            kind, detail, distance = measured
            return kind, f"{UNRECORDED}; {detail}", distance
        said, distance = measured
        if distance > self.tolerance:
            return (VerdictKind.wrong_contribution, f"{UNRECORDED}; what it declared it put in "
                    "the outer exchange is not its round's pseudo-gradient", distance)
        if said.count != found.samples:
            return (VerdictKind.wrong_samples, f"{UNRECORDED}; sent a samples count of "
                    f"{said.count} beside its pseudo-gradient; its round computed "
                    f"{found.samples}", None)
        lied = loss_problem(found.record, step_records, self.replayer.loss_sum,
                            self.replayer.loss_samples, self.tolerance)
        if lied is not None:
            return lied[0], f"{UNRECORDED}; {lied[1]}", lied[2]
        return (VerdictKind.valid, f"{UNRECORDED}; its round replays to the pseudo-gradient it "
                "declared (a worker lost before it filed)", distance)

    # -- one round -----------------------------------------------------------------

    def _round(self, worker: str, end: int, lineage: dict[int, list[WorkRecord]],
               everyone: KnownRecords, depth: int) -> RoundEnd | Finding:
        """Replay `worker`'s round that ends at step `end` from its kept states."""
        ends = [r for r in lineage.get(end, []) if r.local is not None]
        if not ends:
            return VerdictKind.unavailable, f"no record of step {end} says where its round began", None
        start = round_start(ends)
        expected = collections.Counter(r.local.round_expected for r in ends
                                       if r.local.outer).most_common(1)
        outer = self.local.round_starts.params(start, everyone)
        if outer is None or not expected:
            return (VerdictKind.unavailable,
                    f"no agreed parameters or samples for the round starting at step {start}", None)
        outer_sha256, outer_flat = outer
        samples, last, record = 0, None, None
        for step in range(start, end + 1):
            records = lineage.get(step, [])
            held = seat(worker, records, self.members)
            if held is None:
                return (VerdictKind.unavailable, f"not a member at step {step} of its round "
                        "(it joined inside it): not judged without its records", None)
            try:
                kept = self.store.load_local(worker, step)
            except UnreadableFile as error:
                return (VerdictKind.bad_commitment, f"the state it kept for its step {step} is "
                        f"not a state: {error}", None)
            if kept is None:
                return VerdictKind.withheld, f"the state its step {step} started from is not kept", None
            params, state = kept
            if not _loads(self.replayer, params):
                return (VerdictKind.wrong_params, f"the state it kept for its step {step} is "
                        "not one of the job's model", None)
            here = (param_sha256(self.replayer.model), optimizer_state_sha256(state))
            if last is not None and here == last.start:
                pass  # its own guard skipped the step before: its samples do not count
            elif last is not None and here[0] != outer_sha256:
                distance = max(
                    relative_distance(state_tensors(last.end_state), state_tensors(state)),
                    relative_distance([last.end_flat - last.start_flat],
                                      [self.replayer.flat_params() - last.start_flat]))
                if distance > self.tolerance:
                    return (VerdictKind.wrong_contribution, f"step {step - 1} of its round does "
                            f"not end where its step {step} started", distance)
                samples += last.share
            elif here[0] != outer_sha256:  # the round's first step
                return (VerdictKind.wrong_params, "its round did not start from the round's "
                        "agreed parameters", None)
            else:  # the round's start, or back at theta_outer inside it (a rollback, a join)
                broken = self._start_problem(worker, step, start, state, lineage, everyone,
                                             restart=last is not None, depth=depth)
                if broken is not None:
                    return broken
                samples = 0
                self.replayer.load(params)  # replaying an earlier round moved the model
            record = stand_in(held, records)
            start_flat = self.replayer.flat_params().clone()
            gradients = self.replayer.contribution(record)
            try:
                end_state = (self.replayer.local_step(record, params, state, gradients)
                             if record.samples > 0 else state)
            except (RuntimeError, KeyError, ValueError, IndexError):
                return (VerdictKind.wrong_params, f"the optimizer state it kept for its step "
                        f"{step} is not one of the job's optimizer", None)
            last = _Replayed(here, start_flat, self.replayer.flat_params().clone(), end_state,
                             record.samples)
        samples += last.share  # a round's last step is taken before its exchange
        pseudo = (outer_flat - self.replayer.flat_params()) * (samples / expected[0][0])
        return RoundEnd(last.end_state, pseudo, samples, record)

    def _start_problem(self, worker: str, step: int, first: int, state: dict,
                       lineage: dict[int, list[WorkRecord]], everyone: KnownRecords, *,
                       restart: bool, depth: int) -> Finding | None:
        """None if the optimizer `state` a start at theta_outer shows is one the worker
        may start from there (`StartCheck.may_start_from`, or where its record-less
        previous round ended); else why not."""
        state_sha256 = optimizer_state_sha256(state)
        if self._vouched.get((worker, step)) == state_sha256 or \
                self.local.starts.may_start_from(state_sha256, step, everyone, restart=restart):
            return None
        if step == first and depth > 0 and _after_record_less_round(worker, step, lineage):
            # Its previous round has no record of its end either: replay that round.
            previous = self._round(worker, step - 1, lineage, everyone, depth - 1)
            if not isinstance(previous, RoundEnd):
                kind, detail, distance = previous
                if kind is VerdictKind.withheld:
                    # That round's own audit asks for its files; here they may be past the
                    # window an honest worker keeps them for.
                    kind = VerdictKind.unavailable
                return kind, f"its round before: {detail}", distance
            distance = relative_distance(state_tensors(previous.end_state), state_tensors(state))
            if distance <= self.tolerance:
                self._vouched[worker, step] = state_sha256
                return None
            return (VerdictKind.wrong_params, "the optimizer state its round started from is "
                    "not where its previous round ended", distance)
        return (VerdictKind.wrong_params, "its round started from an optimizer state that is "
                "neither a fresh one nor one the step before it left", None)


def _loads(replayer: Replayer, params: dict) -> bool:
    """Load a kept state the worker wrote into the replayer's model; False if it is not
    a state of that model (a file shaped for another cannot crash the verifier)."""
    try:
        replayer.load(params)
    except (RuntimeError, KeyError, ValueError):
        return False
    return True


def seat(worker: str, records: list[WorkRecord], members: Members) -> Unrecorded | None:
    """`worker`'s seat in a step (`records`: its final lineage), named by the published
    membership of the epoch most of them ran in; None where it held none."""
    if not records:
        return None
    epoch = collections.Counter(r.membership_epoch for r in records).most_common(1)[0][0]
    seats = members(epoch)
    if seats is None or worker not in seats:
        return None
    return Unrecorded(records[0].step, list(seats).index(worker), epoch, worker)


def round_start(end_records: list[WorkRecord]) -> int | None:
    """Where the round ending at a step began, as most of the step's records say."""
    starts = collections.Counter(r.local.round_start for r in end_records if r.local is not None)
    return starts.most_common(1)[0][0] if starts else None


def record_less_rounds(worker: str, end: int, lineage: dict[int, list[WorkRecord]]
                       ) -> list[range]:
    """The rounds whose kept states judging `worker`'s record-less round ending at `end`
    may read, oldest first: that round, and its earlier rounds back to one whose end it
    recorded (at most MAX_ROUNDS_BACK more). `lineage`: the final lineage's records by
    step."""
    rounds: list[range] = []
    for _ in range(MAX_ROUNDS_BACK + 1):
        start = round_start(lineage.get(end, []))
        if start is None:
            break
        rounds.insert(0, range(start, end + 1))
        if not _after_record_less_round(worker, start, lineage):
            break
        end = start - 1
    return rounds


def _after_record_less_round(worker: str, start: int, lineage: dict[int, list[WorkRecord]]
                             ) -> bool:
    """Does the round starting at `start` follow a round whose end `worker` (a member,
    presumably) filed no record of?"""
    before = lineage.get(start - 1, [])
    return (start > 0 and not any(r.worker == worker for r in before)
            and any(r.local is not None and r.local.outer for r in before))
