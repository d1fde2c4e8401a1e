"""Forced errors served through the coordinator (Truebit), a service it holds: the
coordinator, as the operator, serves verifiers planted wrong records at a known rate,
so a verifier that signs `valid` without replaying loses stake.

Which records are planted follows from a secret per job (`shoal.proof.forced`),
committed to in an event before any of its epochs is served, and revealed with the
penalties once the job's audits are over. A plant is a real record whose revealed
contribution the coordinator fetched from the worker's agent, scaled (plant_files.py)
and re-committed: the record, its file, the file's hash and the epoch's served root all
agree, so every cheap check passes and only a replay shows it wrong. Every rooted epoch
waits the same `forced_error_wait_s` for its plants' files before verifiers see it, and
no reveal of it may be challenged before, so neither timing nor an early copy tells.

What a hostile verifier cannot tell, and what it can (and why that stays):
- not which epochs hold plants: the served root of one that does differs from the
  workers' root, so the chain holds neither, but the workers' root sealed with a salt
  from the secret (forced_plans.py `anchored_value`, `shoal.proof.forced.sealed_root`),
  which anyone checks after the reveal.
- a provider sees its agent asked for a file no verifier challenged: colluding with a
  verifier, it can tell its own records' plants (it knows its true records anyway).
- the referee rules at once on a guilty verdict on a real record, not on a plant (a
  replay of the worker's real record would call it a false accusation): a plant's guilty
  verdict stays unruled until the reveal.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import (
    AgentRow, ForcedPlanRow, JobRow, PlantRow, ProofEpochRow, ServedEpochRow, VerdictRow,
    WorkRecordRow,
)
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.coordinator.proofs import windows
from shoal.coordinator.proofs.forced_plans import forced_plan
from shoal.coordinator.proofs.open_challenges import OpenChallenges
from shoal.coordinator.proofs.penalties import Penalties
from shoal.coordinator.proofs.plant_files import planted_reveal, with_plants
from shoal.coordinator.proofs.records import ProofRecords
from shoal.coordinator.proofs.views import fetch_view
from shoal.coordinator.services.job_specs import JobSpecs
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.numbering import FETCH_BASE
from shoal.coordinator.settings import CoordinatorSettings
from shoal.proof.epochs import epoch_of, final_lineage, steps_of
from shoal.proof.forced import ForcedErrors
from shoal.proof.layout import ProofLayout
from shoal.proof.merkle import epoch_tree
from shoal.spec.audit import ChallengeView, ProofEpochView
from shoal.spec.coordinator import COORDINATOR, ENDED, JobStatus
from shoal.spec.events import ForcedErrorMissed, ForcedErrorsRevealed, ProofEpochServed
from shoal.spec.proof import Ruling, Verdict, VerdictKind, WorkRecord
from shoal.train.files import write_whole

log = logging.getLogger(__name__)
FETCHING, READY, DROPPED = "fetching", "ready", "dropped"


class Plants:
    """Each job's forced errors: planned, fetched, served to verifiers, and revealed with
    the penalties of the verifiers they caught."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 specs: JobSpecs, records: ProofRecords, open_challenges: OpenChallenges,
                 penalties: Penalties) -> None:
        """`open_challenges`: where a plant's fetch of its worker's real file is asked;
        `penalties`: what a verifier that missed a plant pays."""
        self.store, self.desk, self.settings = store, desk, settings
        self.specs, self.records, self.open = specs, records, open_challenges
        self.penalties = penalties
        with store.read() as session:  # fetches asked before a restart are asked again
            open_challenges.ask(fetch_view(row) for row in session.scalars(
                select(PlantRow).where(PlantRow.state == FETCHING)))

    @property
    def forced_errors_on(self) -> bool:
        return self.settings.forced_error_rate > 0

    # ------------------------------------------------------------ the rounds' pass
    def plant_forced_errors(self) -> None:
        """Plan, fetch plants for, publish and (after a job's end) reveal each job's epochs."""
        if not self.forced_errors_on:
            return
        with self.store.read() as session:
            rooted = set(session.scalars(select(ProofEpochRow.job_id).distinct()))
            revealed = set(session.scalars(select(ForcedPlanRow.job_id).where(
                ForcedPlanRow.revealed_at_s.is_not(None))))
        for job_id in sorted(rooted - revealed):
            try:
                if self._advance(job_id):
                    self.reveal_forced_errors(job_id)
            except Exception:  # noqa: BLE001 - one job's failure must not stop the others
                log.exception("job %s: forced errors could not advance", job_id)

    def _advance(self, job_id: str) -> bool:
        """One step of the job's plan; True when its audits are over (time to reveal)."""
        fetches, dropped = [], []
        with self.desk.change() as session:
            now = self.desk.now_s()
            job = session.get(JobRow, job_id)
            plan = forced_plan(session, job_id, self.settings.forced_error_rate, now)
            served = {r.epoch: r for r in session.scalars(
                select(ServedEpochRow).where(ServedEpochRow.job_id == job_id))}
            rooted = session.scalars(select(ProofEpochRow.epoch).where(
                ProofEpochRow.job_id == job_id)).all()
            for epoch in sorted(set(rooted) - set(served)):
                fetches += self._schedule(session, job, plan, epoch, now)
            for row in served.values():
                if row.published_at_s is None and now >= row.scheduled_at_s + \
                        self.settings.forced_error_wait_s:
                    dropped += self._publish(session, row, now)
            ended = JobStatus(job.status) in ENDED and set(rooted) <= set(served)
            last = max((r.published_at_s or now for r in served.values()), default=now)
            done = ended and all(r.published_at_s is not None for r in served.values()) and \
                now >= last + self.settings.forced_error_window_s
        self.open.ask(fetches)
        for view in dropped:
            self.open.drop(view.agent_id, view.challenge)
        return done

    def _schedule(self, session: Session, job: JobRow, plan: ForcedPlanRow, epoch: int,
                  now: float) -> list[ChallengeView]:
        """Mark the epoch's plants and ask their agents for the real files."""
        spec = self.specs.job_spec(job.job_id, job.job_file)
        forced = ForcedErrors(bytes.fromhex(plan.secret), plan.rate)
        steps = steps_of(epoch, spec.proof.epoch_steps, spec.steps)
        rows = {(r.worker, r.step): r for r in session.scalars(select(WorkRecordRow).where(
            WorkRecordRow.job_id == job.job_id, WorkRecordRow.step >= steps.start,
            WorkRecordRow.step < steps.stop))}
        session.add(ServedEpochRow(job_id=job.job_id, epoch=epoch, scheduled_at_s=now))
        fetches = []
        for record in final_lineage([WorkRecord.model_validate(r.body) for r in rows.values()]):
            # An empty contribution has no wrong version that a replay could tell apart.
            if record.contributed and record.plantable and forced.is_planted(record.job, epoch,
                                                                  record.step, record.worker):
                plant = PlantRow(job_id=job.job_id, epoch=epoch, worker=record.worker,
                                 step=record.step, state=FETCHING, requested_at_s=now,
                                 agent_id=rows[(record.worker, record.step)].agent_id)
                session.add(plant)
                session.flush()
                fetches.append(fetch_view(plant))
        return fetches

    def _publish(self, session: Session, row: ServedEpochRow, now: float) -> list[ChallengeView]:
        """Serve the epoch: plants whose files are in, the rest as the workers made them."""
        late = session.scalars(select(PlantRow).where(
            PlantRow.job_id == row.job_id, PlantRow.epoch == row.epoch,
            PlantRow.state == FETCHING)).all()
        for plant in late:
            plant.state = DROPPED
        tree, _ = epoch_tree(self._served(session, row.job_id, row.epoch))
        row.root, row.published_at_s = "0x" + tree.root.hex(), now
        # On record: the operator is held to the tree it served (and the reveal shows which
        # of its leaves were plants).
        record_event(session, now, COORDINATOR, ProofEpochServed(epoch=row.epoch, root=row.root),
                     row.job_id)
        return [fetch_view(plant) for plant in late]

    # ------------------------------------------------------------ what verifiers see
    def _served(self, session: Session, job_id: str, epoch: int) -> list[WorkRecord]:
        plants = {(p.worker, p.step): WorkRecord.model_validate(p.body)
                  for p in session.scalars(select(PlantRow).where(
                      PlantRow.job_id == job_id, PlantRow.epoch == epoch,
                      PlantRow.state == READY))}
        return with_plants(self.records.work_records(job_id, epoch), plants)

    def served_epochs(self, job_id: str) -> list[ProofEpochView]:
        """The rooted epochs verifiers may audit, with the roots of the trees they are served."""
        views = self.records.proof_epochs(job_id)
        keep_s, now = self.specs.job_spec(job_id).proof.keep_s, self.desk.now_s()
        with self.store.read() as session:
            served = windows.served_at(session, job_id, self.forced_errors_on)
            roots = dict(session.execute(select(ServedEpochRow.epoch, ServedEpochRow.root).where(
                ServedEpochRow.job_id == job_id, ServedEpochRow.published_at_s.is_not(None))).all()) \
                if self.forced_errors_on else {}
        out = []
        for view in views:
            if view.epoch not in served:
                continue  # rooted, not served yet (its plants' files are being made)
            closes = served[view.epoch] + keep_s
            update = {"challenges_close_at_s": closes, "challenges_open": now <= closes}
            if self.forced_errors_on:
                update["root"] = roots[view.epoch]
            out.append(view.model_copy(update=update))
        return out

    def served_records(self, job_id: str, epoch: int) -> list[WorkRecord]:
        if not self.forced_errors_on:
            return self.records.work_records(job_id, epoch)
        with self.store.read() as session:
            self._check_served(session, job_id, epoch)
            return self._served(session, job_id, epoch)

    def _check_served(self, session: Session, job_id: str, epoch: int) -> None:
        row = session.get(ServedEpochRow, (job_id, epoch))
        if row is None or row.published_at_s is None:
            # Served early, a record could be compared with its planted version later.
            raise Conflict(f"proof epoch {epoch} of job '{job_id}' is not served to verifiers "
                           f"yet; it is listed at /v1/jobs/{job_id}/proof/epochs once it is")

    def check_challengeable(self, session: Session, job_id: str, step: int) -> None:
        """A reveal may be challenged once its epoch is served, not before (a real file
        fetched early would tell its record's plant from it)."""
        if self.forced_errors_on:
            self._check_served(session, job_id, epoch_of(step, self.specs.job_spec(job_id).proof.epoch_steps))

    def plant_of(self, session: Session, job_id: str, worker: str, step: int) -> PlantRow | None:
        """The served plant at (worker, step), if that record is one."""
        return session.scalar(select(PlantRow).where(
            PlantRow.job_id == job_id, PlantRow.worker == worker, PlantRow.step == step,
            PlantRow.state == READY))

    def is_plant(self, job_id: str, worker: str, step: int) -> bool:
        with self.store.read() as session:
            return self.plant_of(session, job_id, worker, step) is not None

    def plant_path(self, job_id: str, worker: str, step: int) -> Path:
        return ProofLayout(self.records.proof_dir(job_id)).plant(worker, step)

    # ------------------------------------------------------------ the agents' answers
    @staticmethod
    def plant_fetch(session: Session, provider: str, challenge: int) -> PlantRow:
        """The plant whose honest file `challenge` (at or past FETCH_BASE) asks `provider`
        for; NotFound, or Forbidden when it was asked of another provider's agent."""
        # Past a 32-bit key no plant exists (and PostgreSQL would refuse the lookup).
        row = session.get(PlantRow, challenge - FETCH_BASE) \
            if challenge - FETCH_BASE < 2**31 else None
        if row is None:
            raise NotFound(f"no challenge {challenge}")
        agent = session.get(AgentRow, row.agent_id)
        if agent is None or agent.provider != provider:
            raise Forbidden(f"challenge {challenge} is for agent '{row.agent_id}', not yours")
        return row

    def answer_plant(self, provider: str, challenge: int, data: bytes) -> ChallengeView:
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = self.plant_fetch(session, provider, challenge)
            if row.state != FETCHING:
                raise Conflict(f"challenge {challenge} was answered already; an answer is final")
            write_whole(ProofLayout(self.records.proof_dir(row.job_id)).reveal(row.worker, row.step), data)
            record = WorkRecord.model_validate(session.get(
                WorkRecordRow, (row.job_id, row.worker, row.step)).body)
            plan = session.get(ForcedPlanRow, row.job_id)
            made = planted_reveal(data, record, bytes.fromhex(plan.secret),
                                  self.specs.job_spec(row.job_id).proof.tolerance)
            if made is None:
                row.state = DROPPED
            else:
                served, blob = made
                write_whole(self.plant_path(row.job_id, row.worker, row.step), blob)
                row.state, row.sha256 = READY, hashlib.sha256(blob).hexdigest()
                row.body = served.model_dump(mode="json")
            view = fetch_view(row).model_copy(update={
                "answered_at_s": now, "sha256": hashlib.sha256(data).hexdigest()})
        self.open.drop(view.agent_id, challenge)
        return view

    # ------------------------------------------------------------ the reveal
    def reveal_forced_errors(self, job_id: str) -> None:
        """Publish the job's secret and which records were plants; name (and, on a chain,
        slash) each verifier that signed `valid` on one. Only once the job has ended: the
        secret decides its later epochs' plants too."""
        misses: list[tuple[int, str, str, int, str | None]] = []
        with self.desk.change() as session:
            now = self.desk.now_s()
            job, plan = session.get(JobRow, job_id), session.get(ForcedPlanRow, job_id)
            if job is None or plan is None or plan.revealed_at_s is not None:
                return
            if JobStatus(job.status) not in ENDED:
                raise Conflict(f"job '{job_id}' is still running: its plants are revealed "
                               "after it ends")
            plan.revealed_at_s = now
            plants = session.scalars(select(PlantRow).where(PlantRow.job_id == job_id)
                                     .order_by(PlantRow.plant)).all()
            ready = {(p.worker, p.step) for p in plants if p.state == READY}
            rows = session.scalars(select(VerdictRow).where(
                VerdictRow.job_id == job_id, VerdictRow.ruling.is_(None))
                .order_by(VerdictRow.seq)).all()
            said: dict[tuple[str, int], list[tuple[VerdictRow, Verdict]]] = {}
            for row in rows:
                if (row.worker, row.step) in ready:
                    verdict = Verdict.model_validate(row.body["verdict"])
                    # `withheld` says only that the worker's agent had not answered yet:
                    # nothing about the planted contribution, so it catches nothing (or a
                    # verifier could file it at once on every record and never replay).
                    row.ruling = Ruling.plant_missed if verdict.kind is VerdictKind.valid else \
                        Ruling.plant_caught if verdict.guilty and verdict.kind is not VerdictKind.withheld \
                        else Ruling.plant_abstained
                    said.setdefault((row.worker, row.step), []).append((row, verdict))
            for (worker, step), verdicts in said.items():
                catcher = next((v.verifier for r, v in verdicts if r.ruling == Ruling.plant_caught), None)
                named = set()
                for row, verdict in verdicts:
                    if row.ruling == Ruling.plant_missed and verdict.verifier.lower() not in named:
                        named.add(verdict.verifier.lower())
                        misses.append((row.seq, verdict.verifier, worker, step, catcher))
            record_event(session, now, COORDINATOR, ForcedErrorsRevealed(
                secret=plan.secret, commitment=plan.commitment, rate=plan.rate,
                plants=[(p.epoch, p.worker, p.step, p.state) for p in plants],
                missed=[(m[1], m[2], m[3]) for m in misses]), job_id)
        for seq, verifier, worker, step, catcher in misses:
            self._penalise_miss(job_id, seq, verifier, worker, step, catcher)

    def _penalise_miss(self, job_id: str, seq: int, verifier: str, worker: str, step: int,
                       catcher: str | None) -> None:
        # The stake goes in part to a verifier that caught the same plant, else the operator.
        settlement = self.penalties.settlement
        to = catcher or (settlement.operator.address if settlement is not None else None)
        note = self.penalties.penalise_missed_plant(verifier, to) if to else {}
        with self.desk.change() as session:
            record_event(session, self.desk.now_s(), COORDINATOR, ForcedErrorMissed(
                verdict=seq, verifier=verifier, worker=worker, step=step, **note), job_id)
        log.warning("job %s: verifier %s signed valid on a planted record (%s step %d)",
                    job_id, verifier, worker, step)
