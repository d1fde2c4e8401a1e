"""Challenges and verdicts, mixed into `Coordinator`: verifiers raise
challenges for the files only a worker's agent holds (a revealed contribution,
or the parameters a step started from), which the agent answers once, at its
next beat; verifiers file signed verdicts, and the referee (referee.py) rules
on the guilty ones.

Open challenges are kept in memory by agent as well as in the store: the
heartbeat's reply carries them without a store read. Forced errors (plants.py) are
served through the same routes, indistinguishable from real records until the reveal.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, defaultdict
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.proofs import windows
from shoal.coordinator.errors import Conflict, Forbidden, Gone, NotFound
from shoal.coordinator.proofs.keeper_checks import WrongParams
from shoal.coordinator.proofs.keeper_routing import KeeperRouting
from shoal.coordinator.services.numbering import FETCH_BASE
from shoal.coordinator.proofs.plants import ForcedErrorService
from shoal.coordinator.proofs.referee import own_file_challenges, vouched_steps
from shoal.coordinator.db.schema import (
    AgentRow, ChallengeRow, ForcedPlanRow, LeaseRow, OfferRow, VerdictRow, WorkRecordRow,
)
from shoal.coordinator.db.store import record_event
from shoal.proof.epochs import final_lineage, params_keepers, window_epoch
from shoal.proof.layout import ProofLayout
from shoal.spec.audit import (
    BlobKind, ChallengeRequest, ChallengeView, VerdictFiling, VerdictView,
)
from shoal.spec.events import ChallengeAnswered, ChallengeRaised, VerdictsFiled
from shoal.spec.proof import Ruling, Verdict, VerdictKind, WorkRecord
from shoal.spec.worker import WorkerId
from shoal.verify.audit.unrecorded_round import seat
from shoal.train.files import write_whole


class AuditService(ForcedErrorService, KeeperRouting):
    """Uses the Coordinator's `engine`, `settings`, `referee`, `_change`, `now_s`,
    and ProofService's `proof_dir`, `job_spec` and `_proof_job`. Which keeper a step's
    parameters are asked of, and checking its answer: keeper_routing.py."""

    def _audit_init(self) -> None:
        self._challenge_lock = threading.Lock()
        self._pending: dict[str, dict[int, ChallengeView]] = defaultdict(dict)  # agent -> open
        with self.store.read() as session:
            for row in session.scalars(select(ChallengeRow).where(ChallengeRow.answered_at_s.is_(None))):
                self._pending[row.agent_id][row.challenge] = _challenge_view(row)
        self._forced_init()
        self._keeper_init()

    def raise_challenges(self, verifier: str, job_id: str,
                         items: tuple[ChallengeRequest, ...]) -> list[ChallengeView]:
        out = []
        with self.desk.change() as session:
            now = self.desk.now_s()
            self._proof_job(session, job_id)
            for item in items:
                if item.kind is not BlobKind.params:  # a worker's own file
                    self.check_challengeable(session, job_id, item.step)
                if item.kind is BlobKind.params:  # the step's, whoever asks: one challenge
                    row = _params_challenge(session, job_id, item.step)
                else:
                    row = session.scalar(select(ChallengeRow).where(
                        ChallengeRow.job_id == job_id, ChallengeRow.worker == item.worker,
                        ChallengeRow.step == item.step, ChallengeRow.kind == item.kind.value))
                if row is None:  # a new challenge: only inside the epoch's window
                    self._check_window(session, job_id, item.step, now)
                    agent_id, worker = self._holder(session, job_id, item)
                    row = ChallengeRow(job_id=job_id, worker=worker, step=item.step,
                                       kind=item.kind.value, requested_by=verifier,
                                       requested_at_s=now, agent_id=agent_id)
                    session.add(row)
                    session.flush()
                    record_event(session, now, verifier, ChallengeRaised(
                        challenge=row.challenge, worker=item.worker, step=item.step,
                        blob=item.kind.value, agent_id=row.agent_id), job_id)
                out.append(_challenge_view(row))
        with self._challenge_lock:
            for view in out:
                if view.answered_at_s is None:
                    self._pending[view.agent_id][view.challenge] = view
        return out

    def _check_window(self, session: Session, job_id: str, step: int, now: float) -> None:
        """A challenge is taken until the window of the step's files closes (windows.py),
        never after: its workers may have dropped the file, and silence then is not
        withholding. Asking again for a file asked for in time stays possible (the same
        challenge). Under DiLoCo a step's files are read by its round's end's audit too,
        so their window is that of the epoch the round ends in."""
        spec = self.job_spec(job_id)
        proof = spec.proof
        epoch = window_epoch(step, proof.epoch_steps, spec.sync.inner_steps - 1, spec.steps)
        closes = windows.closes_at(session, job_id, epoch, proof.keep_s, self.forced_errors_on)
        if closes is not None and now > closes:
            raise Gone(f"the challenge window of step {step}'s files (that of proof epoch {epoch}"
                       f", whose audits read them last) of job '{job_id}' closed "
                       f"{now - closes:.0f} s ago (it stays open [proof] keep_s = "
                       f"{proof.keep_s:g} s after the epoch is served): its files may be gone "
                       "from the workers, and nobody is asked for them any more")

    def _holder(self, session: Session, job_id: str, item: ChallengeRequest) -> tuple[str, str]:
        """The agent that holds the file: the worker's, or for parameters, the agent of one
        of the step's keepers (keeper_routing.py) not refused for it, an online one first."""
        if item.kind is BlobKind.params:
            keepers = self._unrefused_keepers(session, job_id, item.step)
            if not keepers:
                raise NotFound(f"no worker keeping step {item.step}'s parameters in job "
                               f"'{job_id}' is left to ask (none filed a record or held a "
                               "seat, or each one's answer was refused)")
            return keepers[0].agent_id, keepers[0].worker
        rows = session.scalars(select(WorkRecordRow).where(
            WorkRecordRow.job_id == job_id, WorkRecordRow.step == item.step)).all()
        found = [r for r in rows if r.worker == item.worker]
        if not found and item.kind is BlobKind.local:  # its agent holds it: a seat's lease's
            agent_id = self._seated_agent(session, job_id, item, rows)
            if agent_id is not None:
                return agent_id, item.worker
        if not found:
            raise NotFound(f"no work record of {item.worker} at step {item.step} in job "
                           f"'{job_id}' to challenge")
        return found[0].agent_id, found[0].worker

    def _seated_agent(self, session: Session, job_id: str, item: ChallengeRequest,
                      rows: list[WorkRecordRow]) -> str | None:
        """The agent that holds a file of a worker that filed no record of the step, if
        the worker held a seat in the step's final lineage: its lease's. It still kept
        what its seat keeps (under DiLoCo the state its step started from, which an
        audit of its record-less round needs; a keeper, the step's parameters)."""
        lineage = final_lineage(WorkRecord.model_validate(row.body) for row in rows)
        if seat(item.worker, lineage, lambda e: self._published.members(job_id, e)) is None:
            return None
        named = WorkerId.leased(item.worker)
        lease = session.get(LeaseRow, named.lease) if named is not None else None
        if lease is None or lease.job_id != job_id:
            return None
        offer = session.get(OfferRow, lease.offer_id)
        return offer.agent_id if offer is not None else None

    def _seated_keepers(self, job_id: str, step: int, rows: list[WorkRecordRow]) -> list[str]:
        """The workers whose seats in the step's final lineage keep its parameters, named
        by the job's published membership."""
        lineage = final_lineage(WorkRecord.model_validate(row.body) for row in rows)
        if not lineage:
            return []
        epoch = Counter(r.membership_epoch for r in lineage).most_common(1)[0][0]
        seats = self._published.members(job_id, epoch)
        return [seats[rank] for rank in sorted(params_keepers(step, len(seats)))] if seats else []

    def pending_challenges(self, agent_id: str) -> tuple[ChallengeView, ...]:
        """What the agent must answer (the heartbeat's reply: memory only, no store read)."""
        with self._challenge_lock:
            return tuple(self._pending.get(agent_id, {}).values())

    def challenges(self, job_id: str) -> list[ChallengeView]:
        """The job's challenges; an unanswered one says whether its agent is offline (silent
        past the agent timeout), so a verifier need not wait for an answer that cannot come."""
        return [view for view, _ in self.challenges_held(job_id)]

    def challenges_held(self, job_id: str, only: set[int] | None = None
                        ) -> list[tuple[ChallengeView, float]]:
        """The job's challenges (those numbered in `only`, if given), each with when its
        agent last beat (0.0: never). A parameters challenge whose keeper is silent is
        handed to the step's other keeper first, if that one's agent is online."""
        self._reroute_silent(job_id, only)
        horizon = self.desk.now_s() - self.settings.agent_timeout_s
        query = select(ChallengeRow).where(ChallengeRow.job_id == job_id)
        if only is not None:
            query = query.where(ChallengeRow.challenge.in_(only))
        with self.store.read() as session:
            rows = session.scalars(query.order_by(ChallengeRow.challenge)).all()
            seen = dict(session.execute(select(AgentRow.agent_id, AgentRow.last_seen_s).where(
                AgentRow.agent_id.in_({row.agent_id for row in rows}))).all())
            return [(_challenge_view(row).model_copy(update={
                        "holder_offline": row.answered_at_s is None
                        and seen.get(row.agent_id, 0.0) < horizon}),
                     seen.get(row.agent_id, 0.0))
                    for row in rows]

    def answer_challenge(self, provider: str, challenge: int, data: bytes) -> ChallengeView:
        """Store the file a challenge's agent sends. Parameters are checked first (loading
        them takes a while: outside the store lock), and a wrong file is refused (409) and
        the challenge handed to the step's other keeper (keeper_routing.py)."""
        if not data:
            raise Conflict("an answer is the file the worker wrote; the body is empty")
        if challenge >= FETCH_BASE:
            return self.answer_plant(provider, challenge, data)
        with self.store.read() as session:
            row = self._answerable(session, provider, challenge)
            job_id, step, kind = row.job_id, row.step, row.kind
        refusal = None
        if kind == BlobKind.params.value:
            try:
                self._check_keeper_answer(job_id, step, data)
            except WrongParams as error:
                refusal = str(error)
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = self._answerable(session, provider, challenge)
            keeper = self._answering_keeper(session, row, provider)
            if refusal is not None:
                told, move = self._refuse_keeper(session, row, keeper, provider, refusal, now)
            else:
                view = self._take_answer(session, row, provider, data, now)
        if refusal is not None:
            self._move_pending([move] if move else [])
            raise WrongParams(f"{refusal} ({told})")
        with self._challenge_lock:  # a parameters challenge may be asked of two keepers
            for pending in self._pending.values():
                pending.pop(challenge, None)
        self._rerouted_s.pop(challenge, None)
        return view

    def _answerable(self, session: Session, provider: str, challenge: int) -> ChallengeRow:
        row = session.get(ChallengeRow, challenge)
        if row is None:
            raise NotFound(f"no challenge {challenge}")
        self._answering_keeper(session, row, provider)  # raises Forbidden for anyone else
        if row.answered_at_s is not None:
            raise Conflict(f"challenge {challenge} was answered already; an answer is final")
        return row

    def _take_answer(self, session: Session, row: ChallengeRow, provider: str, data: bytes,
                     now: float) -> ChallengeView:
        path = self._blob_path(row)
        write_whole(path, data)
        row.answered_at_s, row.sha256 = now, hashlib.sha256(data).hexdigest()
        size = len(data)
        plant = self.plant_of(session, row.job_id, row.worker, row.step) \
            if row.kind == BlobKind.reveal.value else None
        if plant is not None:  # what the verifier downloads, and must be able to check
            row.sha256 = plant.sha256
            size = self.plant_path(row.job_id, row.worker, row.step).stat().st_size
        record_event(session, now, provider, ChallengeAnswered(
            challenge=row.challenge, bytes=size, sha256=row.sha256), row.job_id)
        return _challenge_view(row)

    @staticmethod
    def _view(row: ChallengeRow) -> ChallengeView:  # for keeper_routing.py
        return _challenge_view(row)

    def _blob_path(self, row: ChallengeRow) -> Path:
        return ProofLayout(self.proof_dir(row.job_id)).kept(BlobKind(row.kind), row.worker,
                                                            row.step)

    def challenge_file(self, challenge: int) -> Path:
        with self.store.read() as session:
            row = session.get(ChallengeRow, challenge)
            if row is None:
                raise NotFound(f"no challenge {challenge}")
            if row.answered_at_s is None:
                raise NotFound(f"challenge {challenge} is not answered yet; its agent sends the "
                               "file at its next heartbeat")
            if row.kind == BlobKind.reveal.value and \
                    self.plant_of(session, row.job_id, row.worker, row.step) is not None:
                return self.plant_path(row.job_id, row.worker, row.step)
            return self._blob_path(row)

    # ------------------------------------------------------------ verdicts
    def file_verdicts(self, verifier: str, job_id: str, filing: VerdictFiling) -> list[VerdictView]:
        from shoal.verify.roles.verdicts import SignedVerdict

        out, guilty = [], []
        with self.desk.change() as session:
            now = self.desk.now_s()
            job = self._proof_job(session, job_id)
            name = self.job_spec(job_id, job.job_file).name
            plan = session.get(ForcedPlanRow, job_id)
            for body in filing.verdicts:
                signed = SignedVerdict(verdict=body.verdict, signature=body.signature)
                if signed.verdict.verifier.lower() != verifier.lower() or not signed.authentic:
                    raise Forbidden("each verdict must be signed by the key that files it "
                                    f"({verifier}); sign them with `shoal verify --key`")
                if signed.verdict.job != name:
                    raise Conflict(f"a verdict names job '{signed.verdict.job}', not '{name}'")
                if signed.verdict.kind is VerdictKind.withheld:
                    _check_still_withheld(session, job_id, signed.verdict)
                row = VerdictRow(job_id=job_id, at_s=now, verifier=verifier,
                                 worker=signed.verdict.worker, step=signed.verdict.step,
                                 kind=signed.verdict.kind.value, body=body.model_dump(mode="json"))
                planted = self.plant_of(session, job_id, row.worker, row.step) is not None
                if planted and plan.revealed_at_s is not None:
                    row.ruling = Ruling.plant_late  # filed knowing the plants: it tells nothing
                session.add(row)
                session.flush()
                out.append(_verdict_view(row))
                # A plant is the operator's, never the worker's guilt: its verdicts wait for
                # the reveal, and the referee never replays it (see plants.py).
                if signed.verdict.guilty and not planted:
                    guilty.append(row.seq)
            kinds: dict[str, int] = defaultdict(int)
            for view in out:
                kinds[view.verdict.kind.value] += 1
            record_event(session, now, verifier, VerdictsFiled(
                kinds=dict(kinds), guilty=[(v.verdict.worker, v.verdict.step, v.verdict.kind.value)
                                           for v in out if v.verdict.guilty]), job_id)
        if guilty and self.referee is not None:
            self.referee.rule_later(job_id, guilty)
        return out

    def verdicts(self, job_id: str) -> list[VerdictView]:
        with self.store.read() as session:
            rows = session.scalars(select(VerdictRow).where(VerdictRow.job_id == job_id)
                                   .order_by(VerdictRow.seq))
            return [_verdict_view(row) for row in rows]


def _check_still_withheld(session: Session, job_id: str, verdict: Verdict) -> None:
    """A `withheld` verdict is taken only while one of the files it says were kept back is
    still unanswered: filed over an answer, it would be a false accusation (a slow agent
    answered after the verifier's wait); the verifier should fetch the file and audit it."""
    row = session.get(WorkRecordRow, (job_id, verdict.worker, verdict.step))
    # Without a record (a DiLoCo round its worker filed none of) the files it needs may go
    # back over earlier rounds: any of the worker's files up to the step, still unanswered,
    # lets the verdict in (the referee then rules on exactly the round's).
    steps = vouched_steps(WorkRecord.model_validate(row.body), verdict.step) \
        if row is not None else range(verdict.step + 1)
    asked = own_file_challenges(session, job_id, verdict.worker, steps)
    if asked and all(c.answered_at_s is not None for c in asked):
        numbers = ", ".join(str(c.challenge) for c in asked)
        raise Conflict(f"{verdict.worker}'s files of step {verdict.step} are not withheld: "
                       f"challenge(s) {numbers} were answered; download them "
                       f"(/v1/challenges/N/file), audit the record again and file that verdict")


def _params_challenge(session: Session, job_id: str, step: int) -> ChallengeRow | None:
    """The challenge for a step's parameters, whichever keeper holds it now (an answered
    one first, should a store from before challenges moved between keepers hold two)."""
    rows = session.scalars(select(ChallengeRow).where(
        ChallengeRow.job_id == job_id, ChallengeRow.step == step,
        ChallengeRow.kind == BlobKind.params.value)).all()
    return min(rows, key=lambda r: (r.answered_at_s is None, -r.challenge), default=None)


def _challenge_view(row: ChallengeRow) -> ChallengeView:
    return ChallengeView(challenge=row.challenge, job_id=row.job_id, worker=row.worker,
                         step=row.step, kind=BlobKind(row.kind), agent_id=row.agent_id,
                         requested_at_s=row.requested_at_s, answered_at_s=row.answered_at_s,
                         sha256=row.sha256)


def _verdict_view(row: VerdictRow) -> VerdictView:
    return VerdictView(seq=row.seq, at_s=row.at_s, verdict=Verdict.model_validate(row.body["verdict"]),
                       ruling=row.ruling)
