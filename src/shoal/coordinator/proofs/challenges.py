"""Challenges, a service the coordinator holds: verifiers (and the referee) raise
challenges for the files only a worker's agent holds (a revealed contribution,
a kept state, or the parameters a step started from), which the agent answers
once, at its next beat. Verdicts on what the files show are `verdicts.py`.

Open challenges are kept in memory by agent as well as in the store
(open_challenges.py): the heartbeat's reply carries them without a store read.
Forced errors (plants.py) are served through the same routes, indistinguishable
from real records until the reveal.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import AgentRow, ChallengeRow, JobRow, LeaseRow, WorkRecordRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.errors import Conflict, Forbidden, Gone, NotFound
from shoal.coordinator.proofs import windows
from shoal.coordinator.proofs.keeper_checks import WrongParams
from shoal.coordinator.proofs.keeper_routing import Keepers
from shoal.coordinator.proofs.open_challenges import OpenChallenges
from shoal.coordinator.proofs.plants import Plants
from shoal.coordinator.proofs.records import ProofRecords
from shoal.coordinator.proofs.views import challenge_view
from shoal.coordinator.services.job_specs import JobSpecs
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.numbering import FETCH_BASE
from shoal.coordinator.settings import CoordinatorSettings
from shoal.proof.epochs import window_epoch
from shoal.proof.layout import ProofLayout
from shoal.spec.audit import BlobKind, ChallengeRequest, ChallengeView
from shoal.spec.coordinator import Role
from shoal.spec.events import ChallengeAnswered, ChallengeRaised
from shoal.train.files import write_whole


class Challenges:
    """Challenges for the files a worker's agent holds: raised, routed, answered, served."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 specs: JobSpecs, records: ProofRecords, plants: Plants, keepers: Keepers,
                 open_challenges: OpenChallenges) -> None:
        """`plants`: a reveal's challenge waits for its epoch to be served, and a planted
        record's file is the plant's; `keepers`: whom a step's parameters are asked of."""
        self.store, self.desk, self.settings = store, desk, settings
        self.specs, self.records, self.plants = specs, records, plants
        self.keepers, self.open = keepers, open_challenges
        with store.read() as session:  # challenges asked before a restart are asked again
            open_challenges.ask(challenge_view(row) for row in session.scalars(
                select(ChallengeRow).where(ChallengeRow.answered_at_s.is_(None))))

    def raise_challenges(self, verifier: str, job_id: str,
                         items: tuple[ChallengeRequest, ...]) -> list[ChallengeView]:
        out = []
        with self.desk.change() as session:
            now = self.desk.now_s()
            self.records.proof_job(session, job_id)
            for item in items:
                if item.kind is not BlobKind.params:  # a worker's own file
                    self.plants.check_challengeable(session, job_id, item.step)
                if item.kind is BlobKind.params:  # the step's, whoever asks: one challenge
                    row = _params_challenge(session, job_id, item.step)
                else:
                    row = session.scalar(select(ChallengeRow).where(
                        ChallengeRow.job_id == job_id, ChallengeRow.worker == item.worker,
                        ChallengeRow.step == item.step, ChallengeRow.kind == item.kind.value))
                if row is not None and row.pruned_at_s is not None:
                    raise Gone(self._pruned(row, now))
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
                out.append(challenge_view(row))
        self.open.ask(view for view in out if view.answered_at_s is None)
        return out

    def _check_window(self, session: Session, job_id: str, step: int, now: float) -> None:
        """A challenge is taken until the window of the step's files closes (windows.py),
        never after: its workers may have dropped the file, and silence then is not
        withholding. Asking again for a file asked for in time stays possible (the same
        challenge). Under DiLoCo a step's files are read by its round's end's audit too,
        so their window is that of the epoch the round ends in."""
        spec = self.specs.job_spec(job_id)
        proof = spec.proof
        epoch = window_epoch(step, proof.epoch_steps, spec.sync.inner_steps - 1, spec.steps)
        closes = windows.closes_at(session, job_id, epoch, proof.keep_s, self.plants.forced_errors_on)
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
            keepers = self.keepers.unrefused(session, job_id, item.step)
            if not keepers:
                raise NotFound(f"no worker keeping step {item.step}'s parameters in job "
                               f"'{job_id}' is left to ask (none filed a record or held a "
                               "seat, or each one's answer was refused)")
            return keepers[0].agent_id, keepers[0].worker
        rows = session.scalars(select(WorkRecordRow).where(
            WorkRecordRow.job_id == job_id, WorkRecordRow.step == item.step)).all()
        found = [r for r in rows if r.worker == item.worker]
        if not found and item.kind is BlobKind.local:  # its agent holds it: a seat's lease's
            agent_id = self.keepers.seated_agent(session, job_id, item.worker, rows)
            if agent_id is not None:
                return agent_id, item.worker
        if not found:
            raise NotFound(f"no work record of {item.worker} at step {item.step} in job "
                           f"'{job_id}' to challenge")
        return found[0].agent_id, found[0].worker

    def pending(self, agent_id: str) -> tuple[ChallengeView, ...]:
        """What the agent must answer (the heartbeat's reply: memory only, no store read)."""
        return self.open.of(agent_id)

    def of_job(self, job_id: str) -> list[ChallengeView]:
        """The job's challenges; an unanswered one says whether its agent is offline (silent
        past the agent timeout), so a verifier need not wait for an answer that cannot come."""
        return [view for view, _ in self.held(job_id)]

    def held(self, job_id: str, only: set[int] | None = None
                        ) -> list[tuple[ChallengeView, float]]:
        """The job's challenges (those numbered in `only`, if given), each with when its
        agent last beat (0.0: never). A parameters challenge whose keeper is silent is
        handed to the step's other keeper first, if that one's agent is online."""
        self.keepers.reroute_silent(job_id, only)
        horizon = self.desk.now_s() - self.settings.agent_timeout_s
        query = select(ChallengeRow).where(ChallengeRow.job_id == job_id)
        if only is not None:
            query = query.where(ChallengeRow.challenge.in_(only))
        with self.store.read() as session:
            rows = session.scalars(query.order_by(ChallengeRow.challenge)).all()
            seen = dict(session.execute(select(AgentRow.agent_id, AgentRow.last_seen_s).where(
                AgentRow.agent_id.in_({row.agent_id for row in rows}))).all())
            return [(challenge_view(row).model_copy(update={
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
            return self.plants.answer_plant(provider, challenge, data)
        with self.store.read() as session:
            row = self.answerable(session, provider, challenge)
            job_id, step, kind = row.job_id, row.step, row.kind
        refusal = None
        if kind == BlobKind.params.value:
            try:
                self.keepers.check_answer(job_id, step, data)
            except WrongParams as error:
                refusal = str(error)
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = self.answerable(session, provider, challenge)
            keeper = self.keepers.answering_keeper(session, row, provider)
            if refusal is not None:
                told, move = self.keepers.refuse(session, row, keeper, provider, refusal, now)
            else:
                view = self._take_answer(session, row, provider, data, now)
        if refusal is not None:
            self.keepers.move_open([move] if move else [])
            raise WrongParams(f"{refusal} ({told})")
        self.open.answered(challenge)  # a parameters challenge may be asked of two keepers
        self.keepers.forget(challenge)
        return view

    def answerable(self, session: Session, provider: str, challenge: int) -> ChallengeRow:
        """The challenge `provider` may answer now (NotFound, Forbidden for anyone else's,
        Conflict once answered)."""
        row = session.get(ChallengeRow, challenge)
        if row is None:
            raise NotFound(f"no challenge {challenge}")
        self.keepers.answering_keeper(session, row, provider)  # raises Forbidden for anyone else
        if row.answered_at_s is not None:
            raise Conflict(f"challenge {challenge} was answered already; an answer is final")
        return row

    def _take_answer(self, session: Session, row: ChallengeRow, provider: str, data: bytes,
                     now: float) -> ChallengeView:
        path = self.answer_path(row)
        write_whole(path, data)
        row.answered_at_s, row.sha256 = now, hashlib.sha256(data).hexdigest()
        size = len(data)
        plant = self.plants.plant_of(session, row.job_id, row.worker, row.step) \
            if row.kind == BlobKind.reveal.value else None
        if plant is not None:  # what the verifier downloads, and must be able to check
            row.sha256 = plant.sha256
            size = self.plants.plant_path(row.job_id, row.worker, row.step).stat().st_size
        record_event(session, now, provider, ChallengeAnswered(
            challenge=row.challenge, bytes=size, sha256=row.sha256), row.job_id)
        return challenge_view(row)

    def answer_path(self, row: ChallengeRow) -> Path:
        """Where the answer to `row` lies on the coordinator's disk."""
        return ProofLayout(self.records.proof_dir(row.job_id)).kept(BlobKind(row.kind), row.worker,
                                                            row.step)

    def challenge_file(self, challenge: int, reader: str, reader_role: Role | None) -> Path:
        """The file that answered `challenge`, for someone the job's model may be shown to
        (`Forbidden` for anyone else), and only while it is still the file whose hash was
        taken when it came in (a file is re-checked whenever it is read)."""
        with self.store.read() as session:
            row = session.get(ChallengeRow, challenge)
            if row is None:
                raise NotFound(f"no challenge {challenge}")
            _may_read_model(session, row.job_id, reader, reader_role)
            if row.answered_at_s is None:
                raise NotFound(f"challenge {challenge} is not answered yet; its agent sends the "
                               "file at its next heartbeat")
            if row.kind == BlobKind.reveal.value and \
                    self.plants.plant_of(session, row.job_id, row.worker, row.step) is not None:
                path = self.plants.plant_path(row.job_id, row.worker, row.step)
            else:
                path = self.answer_path(row)
            if row.pruned_at_s is not None:
                raise Gone(self._pruned(row, self.desk.now_s()))
            expected = row.sha256
        if expected is None or _file_sha256(path) != expected:
            raise Conflict(f"challenge {challenge}'s file on the coordinator's disk is not the one "
                           f"answered (sha256 {expected}): refused; the operator must look "
                           "into what changed it")
        return path

    def _pruned(self, row: ChallengeRow, now: float) -> str:
        at = datetime.fromtimestamp(row.pruned_at_s, UTC).isoformat(timespec="seconds")
        return (f"challenge {row.challenge}'s file (step {row.step}'s {row.kind} of job "
                f"'{row.job_id}') was pruned at {at} ({now - row.pruned_at_s:.0f} s ago): its "
                "proof epoch's challenge window had closed more than answer_retention_s = "
                f"{self.settings.answer_retention_s:g} s before, with no guilty verdict on it "
                "awaiting a ruling and no dispute on it open; its hash stays in its challenge, "
                "the file is no longer to be had")


def _may_read_model(session: Session, job_id: str, reader: str, role: Role | None) -> None:
    """A job's model is its submitter's: only its verifiers (and operators), its submitter
    and the providers of its leases may read any of it (issue 40, point 5)."""
    if role in (Role.verifier, Role.operator):
        return
    job = session.get(JobRow, job_id)
    if job is not None and job.submitter.lower() == reader.lower():
        return
    leased = session.scalar(select(LeaseRow.lease).where(
        LeaseRow.job_id == job_id, LeaseRow.provider == reader).limit(1))
    if leased is None:
        raise Forbidden(f"{reader} may not read job '{job_id}''s files: a job's model is its "
                        "submitter's, shown only to its verifiers, its submitter and the "
                        "providers of its leases")


def _file_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _params_challenge(session: Session, job_id: str, step: int) -> ChallengeRow | None:
    """The challenge for a step's parameters, whichever keeper holds it now (an answered
    one first, should a store from before challenges moved between keepers hold two)."""
    rows = session.scalars(select(ChallengeRow).where(
        ChallengeRow.job_id == job_id, ChallengeRow.step == step,
        ChallengeRow.kind == BlobKind.params.value)).all()
    return min(rows, key=lambda r: (r.answered_at_s is None, -r.challenge), default=None)
