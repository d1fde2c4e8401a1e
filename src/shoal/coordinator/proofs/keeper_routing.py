"""Which keeper a step's parameters are asked of, a service the challenges hold.

A step's parameters are kept by two of its workers (`params_keepers`) so that one
cannot decide alone whether the step can be audited. A challenge for them is one
challenge per step, under one number (the verifier polling it just keeps waiting). A
keeper whose answer is refused (keeper_checks.py) hands it to the step's other keeper
and is never asked for the step again. A keeper whose agent is offline, or silent past
the agent timeout, is joined by the other keeper: both are asked, and the first right
answer stands. Taking the challenge from a keeper that is only slow (an honest agent
answering a batch of challenges) would hand the step to a keeper that may be gone.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import AgentRow, ChallengeRow, LeaseRow, OfferRow, WorkRecordRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.errors import Forbidden
from shoal.coordinator.proofs.keeper_checks import (
    check_params, expected_params_sha256, read_params,
)
from shoal.coordinator.proofs.open_challenges import OpenChallenges
from shoal.coordinator.proofs.published_epochs import PublishedEpochs
from shoal.coordinator.proofs.views import challenge_view
from shoal.coordinator.services.job_specs import JobSpecs
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.settings import CoordinatorSettings
from shoal.proof.epochs import final_lineage, params_keepers
from shoal.spec.audit import BlobKind
from shoal.spec.coordinator import COORDINATOR
from shoal.spec.events import ParamsRefused, ParamsRerouted
from shoal.spec.job import JobSpec
from shoal.spec.proof import WorkRecord
from shoal.spec.worker import WorkerId
from shoal.verify.audit.unrecorded_round import seat

if TYPE_CHECKING:
    from shoal.verify.replay import Replayer

log = logging.getLogger(__name__)
MODELS_KEPT = 4  # jobs' models kept to hash answers with (building one reads its corpus)


@dataclass(frozen=True)
class Keeper:
    worker: str
    agent_id: str  # the agent that holds the worker's files
    recorded: bool  # filed a record of the step (else known by its seat alone)
    rank: int  # of its record (of a seat alone: its place among the seats), to order by


@dataclass
class Asked:
    """A keeper a step's parameters were asked of."""

    agent_id: str
    refused: bool  # its answer was refused: never asked for the step again


# A moved challenge: the agent it leaves, the challenge (naming the agent it goes to),
# whether that agent is asked (not when nobody is left to ask), and whether the agent it
# leaves is still asked too (a silent keeper may be only slow; a refused one is not).
Move = tuple[str, ChallengeRow, bool, bool]


class Keepers:
    """Who keeps each step's parameters, whom a challenge for them is asked of, and the
    check of a keeper's answer."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 specs: JobSpecs, published: PublishedEpochs, open_challenges: OpenChallenges,
                 replayer: Callable[[JobSpec], Replayer] | None) -> None:
        """`published`: the seats each job's host published; `replayer`: builds a job's
        model to hash a keeper's answer with (None: any readable answer is taken)."""
        self.store, self.desk, self.settings = store, desk, settings
        self.specs, self.published, self.open = specs, published, open_challenges
        self.replayer = replayer
        # In memory only: a restarted coordinator may ask a refused keeper once more, and
        # refuses its wrong answer again.
        self._asked: dict[tuple[str, int], dict[str, Asked]] = {}
        self._rerouted_s: dict[int, float] = {}  # challenge -> when its holder was last judged
        self._keeper_models: dict[str, tuple[JobSpec, Any]] = {}  # job -> (spec, model)
        self._keeper_model_lock = threading.Lock()  # one answer at a time loads the model

    # ------------------------------------------------------------ the seats' keepers
    def seated_agent(self, session: Session, job_id: str, worker: str,
                     rows: list[WorkRecordRow]) -> str | None:
        """The agent that holds a file of a worker that filed no record of the step, if
        the worker held a seat in the step's final lineage: its lease's. It still kept
        what its seat keeps (under DiLoCo the state its step started from, which an
        audit of its record-less round needs; a keeper, the step's parameters)."""
        lineage = final_lineage(WorkRecord.model_validate(row.body) for row in rows)
        if seat(worker, lineage, lambda e: self.published.members(job_id, e)) is None:
            return None
        named = WorkerId.leased(worker)
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
        seats = self.published.members(job_id, epoch)
        return [seats[rank] for rank in sorted(params_keepers(step, len(seats)))] if seats else []

    # ------------------------------------------------------------ who keeps a step's parameters
    def _step_keepers(self, session: Session, job_id: str, step: int) -> list[Keeper]:
        """The step's keepers in its final lineage (after a restore, a step's parameters
        are those the redone step started from; a decoy record under a later epoch names
        nobody), with the seats' keepers that filed no record of it."""
        rows = session.scalars(select(WorkRecordRow).where(
            WorkRecordRow.job_id == job_id, WorkRecordRow.step == step)).all()
        final = {r.worker for r in final_lineage(WorkRecord.model_validate(row.body)
                                                 for row in rows)}
        out = [Keeper(r.worker, r.agent_id, True, r.body.get("rank"))
               for r in rows if r.worker in final
               and r.body.get("rank") in params_keepers(step, len(r.body.get("shares", ())))]
        recorded = {k.worker for k in out}
        for rank, worker in enumerate(self._seated_keepers(job_id, step, rows)):
            if worker in recorded:
                continue
            agent_id = self.seated_agent(session, job_id, worker, rows)
            if agent_id is not None:
                out.append(Keeper(worker, agent_id, False, rank))
        return out

    def _keepers_by_presence(self, session: Session, keepers: list[Keeper]) -> list[Keeper]:
        """Online agents first, then those with a record, the most recently seen first."""
        seen = self._last_seen(session, {k.agent_id for k in keepers})
        horizon = self.desk.now_s() - self.settings.agent_timeout_s
        return sorted(keepers, key=lambda k: (seen.get(k.agent_id, 0.0) < horizon,
                                              not k.recorded, -seen.get(k.agent_id, 0.0),
                                              k.rank))

    def unrefused(self, session: Session, job_id: str, step: int) -> list[Keeper]:
        asked = self._asked.get((job_id, step), {})
        return self._keepers_by_presence(session, [
            k for k in self._step_keepers(session, job_id, step)
            if not (k.worker in asked and asked[k.worker].refused)])

    @staticmethod
    def _last_seen(session: Session, agents: set[str]) -> dict[str, float]:
        return dict(session.execute(select(AgentRow.agent_id, AgentRow.last_seen_s).where(
            AgentRow.agent_id.in_(agents))).all())

    # ------------------------------------------------------------ answers
    def answering_keeper(self, session: Session, row: ChallengeRow, provider: str) -> str:
        """The keeper `provider` answers for: the holder's, or, of a parameters challenge,
        a keeper it was moved from for silence (a late answer is as good, once checked).
        A keeper whose answer was refused is not heard again for the step."""
        asked = list(self._asked.get((row.job_id, row.step), {}).items()) \
            if row.kind == BlobKind.params.value else []
        agent = session.get(AgentRow, row.agent_id)
        mine = [row.worker] if agent is not None and agent.provider == provider else []
        for worker, was in asked:
            agent = session.get(AgentRow, was.agent_id)
            if agent is not None and agent.provider == provider and worker not in mine:
                mine.append(worker)
        refused = {worker for worker, was in asked if was.refused}
        for worker in mine:
            if worker not in refused:
                return worker
        if mine:
            raise Forbidden(f"your answer to challenge {row.challenge} (step {row.step}'s "
                            "parameters) was refused; the step's other keeper is asked, and "
                            "you are not heard again for it")
        raise Forbidden(f"challenge {row.challenge} is for agent '{row.agent_id}', not yours")

    def check_answer(self, job_id: str, step: int, data: bytes) -> None:
        """Raise `WrongParams` unless `data` is the state most of the step's final
        lineage claims it started from. Unreadable is always refused; with no majority
        claim (a tie), or no replayer to build the job's model with, nothing can tell a
        right state from a wrong one, and any readable one is taken."""
        state = read_params(data, step)
        with self.store.read() as session:
            bodies = session.scalars(select(WorkRecordRow.body).where(
                WorkRecordRow.job_id == job_id, WorkRecordRow.step == step)).all()
        expected = expected_params_sha256(WorkRecord.model_validate(b) for b in bodies)
        build = self.replayer
        if expected is None or build is None:
            return
        spec = self.specs.job_spec(job_id)
        with self._keeper_model_lock:
            held = self._keeper_models.pop(job_id, None)
            if held is None or held[0] != spec:
                try:
                    held = (spec, build(spec).model)
                except Exception:  # noqa: BLE001 - the coordinator's, not the keeper's fault
                    log.exception("job %s: cannot build the model to check step %d's "
                                  "parameters; the answer is taken unchecked", job_id, step)
                    return
            self._keeper_models[job_id] = held  # the newest last: the oldest go first
            while len(self._keeper_models) > MODELS_KEPT:
                self._keeper_models.pop(next(iter(self._keeper_models)))
            check_params(state, held[1], expected, step)

    def refuse(self, session: Session, row: ChallengeRow, keeper: str,
                       provider: str, why: str, now: float) -> tuple[str, Move | None]:
        """Record `keeper`'s refused answer and, if it held the challenge, hand it to the
        step's next keeper. Returns what to tell the agent, and the move to make."""
        asked = self._asked.setdefault((row.job_id, row.step), {})
        agent_id = asked[keeper].agent_id if keeper in asked else row.agent_id
        asked[keeper] = Asked(agent_id, refused=True)
        record_event(session, now, provider, ParamsRefused(
            challenge=row.challenge, step=row.step, keeper=keeper, why=why), row.job_id)
        if keeper != row.worker:  # a keeper it left already: the holder is still asked
            return f"challenge {row.challenge} is asked of {row.worker} now", None
        others = [k for k in self.unrefused(session, row.job_id, row.step)
                  if k.worker != keeper]
        fresh = [k for k in others if k.worker not in asked] or others
        # A keeper on the liar's own agent reads the same file (params/STEP.safetensors): last.
        target = self._free(session, row, sorted(fresh, key=lambda k: k.agent_id == agent_id))
        if target is None:  # nobody left to ask: it stays unanswered, and leaves the liar
            return "no other keeper of the step is left to ask", (row.agent_id, row, False, False)
        return (f"challenge {row.challenge} is now asked of the step's other keeper, "
                f"{target.worker}"), self._route(session, row, target, now, "refused")

    # ------------------------------------------------------------ silence
    def reroute_silent(self, job_id: str, only: set[int] | None) -> None:
        """Ask another keeper whose agent is online for each unanswered parameters
        challenge whose agent is offline, or silent past the agent timeout since it was
        asked, before a verifier reads it as `holder_offline` and gives up on the step.
        The silent keeper is still asked (it may be only slow): the first right answer
        stands. Judged at most once a heartbeat per challenge: verifiers poll often."""
        now = self.desk.now_s()
        horizon = now - self.settings.agent_timeout_s
        with self.store.read() as session:
            rows = session.scalars(select(ChallengeRow).where(
                ChallengeRow.job_id == job_id, ChallengeRow.kind == BlobKind.params.value,
                ChallengeRow.answered_at_s.is_(None))).all()
            seen = self._last_seen(session, {row.agent_id for row in rows})
        due = [row.challenge for row in rows if (only is None or row.challenge in only)
               and (row.requested_at_s < horizon or seen.get(row.agent_id, 0.0) < horizon)
               and self._rerouted_s.get(row.challenge, 0.0) <= now - self.settings.heartbeat_s]
        if not due:
            return
        moves = []
        with self.desk.change() as session:
            for number in due:
                self._rerouted_s[number] = now
                row = session.get(ChallengeRow, number)
                if row.answered_at_s is not None:
                    continue
                others = [k for k in self.unrefused(session, job_id, row.step)
                          if k.agent_id != row.agent_id]  # its own agent is as silent
                seen = self._last_seen(session, {row.agent_id} | {k.agent_id for k in others})
                online = [k for k in others if seen.get(k.agent_id, 0.0) >= horizon]
                asked = self._asked.get((job_id, row.step), {})
                target = self._free(session, row, [k for k in online if k.worker not in asked]
                                    or online)
                if target is not None:
                    why = "offline" if seen.get(row.agent_id, 0.0) < horizon else "silent"
                    moves.append(self._route(session, row, target, now, why))
        self.move_open(moves)

    # ------------------------------------------------------------ moving a challenge
    @staticmethod
    def _free(session: Session, row: ChallengeRow, keepers: list[Keeper]) -> Keeper | None:
        """The first of `keepers` not named by another challenge of the step's parameters
        (one challenge per keeper and step: the store's unique target)."""
        taken = set(session.scalars(select(ChallengeRow.worker).where(
            ChallengeRow.job_id == row.job_id, ChallengeRow.step == row.step,
            ChallengeRow.kind == row.kind, ChallengeRow.challenge != row.challenge)))
        return next((k for k in keepers if k.worker not in taken), None)

    def _route(self, session: Session, row: ChallengeRow, keeper: Keeper, now: float,
               why: str) -> Move:
        """Hand `row` to `keeper`. Its `requested_at_s` becomes now: the time the holder
        was asked, which its silence (and a dispute's wait) is measured from."""
        asked = self._asked.setdefault((row.job_id, row.step), {})
        asked.setdefault(row.worker, Asked(row.agent_id, refused=False))
        asked.setdefault(keeper.worker, Asked(keeper.agent_id, refused=False))
        left = row.agent_id
        record_event(session, now, COORDINATOR, ParamsRerouted(
            challenge=row.challenge, step=row.step, keeper=row.worker, to=keeper.worker,
            agent_id=keeper.agent_id, why=why), row.job_id)
        row.worker, row.agent_id, row.requested_at_s = keeper.worker, keeper.agent_id, now
        session.flush()
        return left, row, True, why != "refused"

    def move_open(self, moves: list[Move]) -> None:
        """After the store took the moves: the agents' heartbeats carry them."""
        for left, row, asked, still in moves:
            if not still:
                self.open.drop(left, row.challenge)
            if asked:
                self.open.ask([challenge_view(row)])

    def forget(self, challenge: int) -> None:
        """`challenge` was answered: its holder is judged no more."""
        self._rerouted_s.pop(challenge, None)
