"""Auditing one work record: is it in the anchored tree, does it tile its
step with the others, did the step start where the job was, is the revealed
contribution the committed one, and does a replay give the same?

The checks run cheapest first and the first failure is the verdict. The
replay is judged by hash where it can be (a replay that hashes to the
commitment is exact: valid with no threshold at all) and otherwise by a
relative l2 distance held to a tolerance profiled from honest re-runs
(`profile_tolerance`): different thread counts or CPUs sum in different
orders, so an honest replay is close to, not equal to, the contribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shoal.proof.merkle import verify_proof
from shoal.spec.proof import Verdict, VerdictKind, WorkRecord
from shoal.verify.audit.local import LocalAudit
from shoal.verify.audit.round_start import load_agreed
from shoal.verify.audit.walk import Finding
from shoal.verify.audit.sent import loss_problem, sent_problem
from shoal.verify.audit.slice import seeds_problem, slice_problem
from shoal.verify.audit.unrecorded import Members, Unrecorded, judge_unrecorded, stand_in
from shoal.verify.audit.unrecorded_round import UnrecordedRounds
from shoal.verify.kept_files import kept_file_bound
from shoal.verify.proof_store import ProofStore, UnreadableFile, contribution_sha256
from shoal.verify.replay import Replayer, relative_distance


@dataclass(frozen=True)
class Inclusion:
    """Where a record sits in its epoch's anchored tree."""

    epoch: int
    index: int
    count: int
    proof: tuple[bytes, ...]
    root: bytes


class Auditor:
    def __init__(self, store: ProofStore, replayer: Replayer, *, hyper_sha256: str,
                 tolerance: float, verifier: str = "",
                 records: Callable[[], list[WorkRecord]] | None = None) -> None:
        """`records`: every record of the job so far (a DiLoCo audit follows a worker's
        chain of steps back to its round's start); the store's own by default."""
        self.store, self.replayer = store, replayer
        # The store reads no file past what this job's model could need (a worker could
        # make its file as large as a disk): set here, where the model is known.
        store.limit_file_bytes(kept_file_bound(replayer.model))
        self.hyper_sha256, self.tolerance, self.verifier = hyper_sha256, tolerance, verifier
        self._loaded_step: int | None = None
        self._loaded_ok = False
        self._undecided: Finding | None = None  # see `_unless_undecided`
        self.local = LocalAudit(store, replayer, tolerance, records or store.records)
        self._rounds: UnrecordedRounds | None = None

    def audit(self, record: WorkRecord, inclusion: Inclusion,
              step_records: list[WorkRecord]) -> Verdict:
        """The verdict on `record`; `step_records`: every record of its step (for tiling)."""
        def verdict(kind: VerdictKind, detail: str = "", distance: float | None = None) -> Verdict:
            return Verdict(job=record.job, epoch=inclusion.epoch, step=record.step,
                           worker=record.worker, kind=kind, distance=distance,
                           tolerance=self.tolerance if distance is not None else None,
                           verifier=self.verifier, detail=detail)

        if not verify_proof(record.leaf(), inclusion.index, inclusion.count, inclusion.proof,
                            inclusion.root):
            return verdict(VerdictKind.bad_proof, "the record is not under the anchored root")
        if record.hyper_sha256 != self.hyper_sha256:
            return verdict(VerdictKind.wrong_params, "recorded under other hyperparameters")
        wrong_seeds = seeds_problem(record, self.replayer.seeds)
        if wrong_seeds:
            return verdict(VerdictKind.wrong_params, wrong_seeds)
        wrong_slice = slice_problem(record, step_records, self.replayer.seeds)
        if wrong_slice is not None:
            return verdict(*wrong_slice)
        if (record.local is not None) != (self.replayer.inner is not None):
            # A DiLoCo record without its own step's claims would audit as `unavailable`
            # forever (its start is its own replica's, which no snapshot holds).
            return verdict(VerdictKind.wrong_params, "the record's kind is not the job's sync: "
                           f"{'a DiLoCo step' if record.local else 'an every-step record'} in a "
                           f"{'DiLoCo' if self.replayer.inner else 'every-step'} job")
        if record.local is not None:  # DiLoCo: the worker's own replica (audit_local)
            ended = _round_end_problem(record, step_records)
            if ended is not None and ended[0] is not VerdictKind.unavailable:
                return verdict(*ended)
            self._loaded_step = None  # the local audit loads other states into the replayer
            self._undecided = ended  # its peers' records disagree: the replays still run
            kind, detail, distance = self.local.audit(
                record, lambda g: self._judge(record, step_records, g))
            if kind is VerdictKind.valid and self._undecided is not None:
                return verdict(*self._undecided)
            return verdict(kind, detail, distance)
        if not self._load(record.step, step_records):
            return verdict(VerdictKind.unavailable, f"no trusted parameters for step {record.step}")
        if record.params_sha256 != self._params_sha256:
            return verdict(VerdictKind.wrong_params, "the step did not start from these parameters")
        try:
            revealed = self.store.load_reveal(record.worker, record.step)
        except UnreadableFile as error:
            return verdict(VerdictKind.bad_commitment, f"the revealed file is not a "
                           f"contribution: {error}")
        if revealed is None:
            return verdict(VerdictKind.withheld, "no contribution revealed for this step")
        if contribution_sha256(record.job, record.worker, record.step, revealed) != record.contribution_sha256:
            return verdict(VerdictKind.bad_commitment, "the revealed contribution is not the committed one")
        self._undecided = None
        found = self._unless_undecided(sent_problem(record, step_records, revealed,
                                                    self.tolerance))
        if found is not None:  # it put other than it committed in the exchange
            return verdict(*found)
        replayed = self.replayer.contribution(record)
        identical = contribution_sha256(record.job, record.worker, record.step,
                                        replayed) == record.contribution_sha256
        distance = 0.0 if identical else relative_distance(replayed, revealed)
        if distance > self.tolerance:
            return verdict(VerdictKind.wrong_contribution, "replay differs from the contribution",
                           distance=distance)
        lied = self._unless_undecided(self._loss_problem(record, step_records))
        if lied is not None:
            return verdict(*lied)
        if self._undecided is not None:
            return verdict(*self._undecided)
        return verdict(VerdictKind.valid, "replay is bit-identical" if identical else "",
                       distance=distance)

    def forget_loaded(self) -> None:
        """Load a step's parameters afresh at its next audit: a file that was missing
        (an unanswered challenge) may be in the store now."""
        self._loaded_step = None

    def _unless_undecided(self, found: Finding | None) -> Finding | None:
        """`found`, unless it is only that the step's records disagree on what the worker
        declared: that is kept as the verdict should nothing worse turn up, and the checks
        that need no declaration (the replay above all) still run. A cheat that writes a
        lie into its own record to split a step of two must not skip its replay so."""
        if found is not None and found[0] is VerdictKind.unavailable:
            self._undecided = self._undecided or found
            return None
        return found

    def audit_unrecorded(self, share: Unrecorded, epoch: int, step_records: list[WorkRecord],
                         members: Members = lambda epoch: None) -> Verdict:
        """The verdict on a named worker's share of a voted step that it filed no record
        for (`shoal.verify.audit.unrecorded`); `step_records`: the step's final lineage.
        Under DiLoCo the step is a round's end, replayed from the worker's kept states
        (`shoal.verify.audit.unrecorded_round`), which `members` names its rank in."""
        assert share.worker is not None, "only a share whose worker is known is judged"
        record = stand_in(share, step_records)
        if self.replayer.inner is not None:
            if self._rounds is None:
                self._rounds = UnrecordedRounds(self.store, self.replayer, self.tolerance,
                                                self.local, members)
            self._loaded_step = None  # the round's replay loads other states
            found = self._rounds.judge(share, step_records)
        elif not self._load(share.step, step_records):
            found: Finding = (VerdictKind.unavailable,
                              f"no trusted parameters for step {share.step}", None)
        else:
            replayed = self.replayer.contribution(record)
            found = judge_unrecorded(record, step_records, replayed, self.replayer.loss_sum,
                                     self.replayer.loss_samples, self.tolerance)
        kind, detail, distance = found
        return Verdict(job=record.job, epoch=epoch, step=share.step, worker=share.worker,
                       kind=kind, distance=distance,
                       tolerance=self.tolerance if distance is not None else None,
                       verifier=self.verifier, detail=detail)

    def _judge(self, record: WorkRecord, step_records: list[WorkRecord],
               revealed: list[torch.Tensor]) -> Finding | None:
        """A replayed gradient against the revealed one, from the loaded state: None if
        bit-identical or within the tolerance, and the loss reported (at a voted step)
        the replay's."""
        replayed = self.replayer.contribution(record)
        if contribution_sha256(record.job, record.worker, record.step, replayed) != \
                contribution_sha256(record.job, record.worker, record.step, revealed):
            distance = relative_distance(replayed, revealed)
            if distance > self.tolerance:
                return VerdictKind.wrong_contribution, "replay differs from the contribution", distance
        # The loss is exchanged where a round ends (that the record says so is checked
        # against its peers' records first).
        if not record.local.outer:
            return None
        return self._unless_undecided(self._loss_problem(record, step_records))

    def _loss_problem(self, record: WorkRecord, step_records: list[WorkRecord]) -> Finding | None:
        """After a replay: the loss the worker reported for the guard against the replay's."""
        return loss_problem(record, step_records, self.replayer.loss_sum,
                            self.replayer.loss_samples, self.tolerance)

    def _load(self, step: int, step_records: list[WorkRecord]) -> bool:
        """Load the step's parameter snapshot if it is the state the step's workers agree
        they started from (the most common claim: one writer cannot forge it)."""
        if self._loaded_step == step:
            return self._loaded_ok
        agreed = load_agreed(self.store, self.replayer, step,
                             [r.params_sha256 for r in step_records])
        self._loaded_step, self._loaded_ok = step, agreed is not None
        self._params_sha256 = agreed or ""
        return self._loaded_ok


def _round_end_problem(record: WorkRecord, step_records: list[WorkRecord]) -> Finding | None:
    """Under DiLoCo: does the record say a round ended at its step (it committed a
    pseudo-gradient) where most of the step's records show the members declared what
    they exchanged? A worker that called its round's end an inner step would reveal no
    pseudo-gradient, and what it put in the outer exchange would go unchecked."""
    views = [r for r in step_records
             if r.step == record.step and r.membership_epoch == record.membership_epoch]
    voted = sum(r.exchanged is not None for r in views)
    if 2 * voted == len(views):  # as many against as for: the audit cannot tell who lies
        return (VerdictKind.unavailable,
                f"the step's records disagree on whether a round ended at step {record.step}", None)
    ended = 2 * voted > len(views)
    if ended == record.local.outer:
        return None
    if ended:
        return (VerdictKind.wrong_params, f"claims no round ended at step {record.step}, where "
                "the step's members declared what they put in the outer exchange", None)
    return (VerdictKind.wrong_params, f"claims a round ended at step {record.step}, where the "
            "step's members exchanged nothing", None)


def profile_tolerance(replayer: Replayer, store: ProofStore, records: list[WorkRecord],
                      thread_counts: tuple[int, ...] = (1, 2), margin: float = 1000.0) -> dict:
    """Honest non-determinism on this device: replay each record at every thread count
    and measure how far the replays are from one another (no worker involved)."""
    before = torch.get_num_threads()
    worst = 0.0
    try:
        for record in records:
            state = store.load_params(record.step)
            if state is None:
                continue
            replayer.load(state)
            replays = []
            for threads in thread_counts:
                torch.set_num_threads(threads)
                replays.append(replayer.contribution(record))
            worst = max([worst] + [relative_distance(replays[0], r) for r in replays[1:]])
    finally:
        torch.set_num_threads(before)
    return {"records": len(records), "thread_counts": list(thread_counts),
            "max_honest_distance": worst, "suggested_tolerance": max(worst * margin, 1e-6)}
