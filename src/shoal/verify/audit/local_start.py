"""Where a DiLoCo step started, checked (checks 1 and 2 of `shoal.verify.audit.local`):
the state its worker kept is the committed one, and it is a start the worker's chain
of steps or the round's start allows, its optimizer state included (a worker that
forges Adam's moments could steer its update anywhere while every replay passed)."""

from __future__ import annotations

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.train.hashing import optimizer_state_sha256, param_sha256
from shoal.verify.audit.round_start import RoundStarts
from shoal.verify.audit.walk import Finding
from shoal.verify.known_records import KnownRecords
from shoal.verify.proof_store import ProofStore, UnreadableFile
from shoal.verify.replay import Replayer


class StartCheck:
    def __init__(self, store: ProofStore, replayer: Replayer, round_starts: RoundStarts) -> None:
        self.store, self.replayer, self.round_starts = store, replayer, round_starts
        self._fresh_sha256: str | None = None

    def kept_start(self, record: WorkRecord, mine: list[WorkRecord], everyone: KnownRecords,
                   outer_sha256: str) -> tuple[Finding | None, tuple[dict, dict] | None]:
        """The state the step started from as its worker kept it, checked: the committed
        one, and one its chain or the round's start allows (`start_problem`). Leaves the
        replayer's model at that start."""
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
        broken = self.start_problem(record, mine, everyone, outer_sha256)
        if broken:
            return (VerdictKind.wrong_params, broken, None), None
        if record.params_sha256 == outer_sha256:
            self.round_starts.keep(record.local.round_start, outer_sha256)
        return None, kept

    def start_problem(self, record: WorkRecord, mine: list[WorkRecord],
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
