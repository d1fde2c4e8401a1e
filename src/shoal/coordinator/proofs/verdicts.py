"""Verdicts, a service the coordinator holds: verifiers file signed verdicts on the
records they audited, and the referee (referee.py) rules on the guilty ones. A
planted record's verdicts wait for the plants' reveal (plants.py)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import ForcedPlanRow, VerdictRow, WorkRecordRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.errors import Conflict, Forbidden
from shoal.coordinator.proofs.plants import Plants
from shoal.coordinator.proofs.records import ProofRecords
from shoal.coordinator.proofs.referee import Referee, own_file_challenges, vouched_steps
from shoal.coordinator.proofs.verdict_stake import VerdictStake
from shoal.coordinator.proofs.views import job_verdicts, verdict_view
from shoal.coordinator.services.job_specs import JobSpecs
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.spec.audit import VerdictFiling, VerdictView
from shoal.spec.events import VerdictsFiled
from shoal.spec.proof import Ruling, Verdict, VerdictKind, WorkRecord


class Verdicts:
    """The verifiers' signed verdicts: checked, stored, and the guilty ones handed to the
    referee."""

    def __init__(self, store: Store, desk: MarketDesk, specs: JobSpecs, records: ProofRecords,
                 plants: Plants, referee: Referee, stake: VerdictStake) -> None:
        """`stake`: whether a verifier's stake covers what its verdicts could cost it."""
        self.store, self.desk, self.specs = store, desk, specs
        self.records, self.plants, self.referee = records, plants, referee
        self.stake = stake

    def file_verdicts(self, verifier: str, job_id: str, filing: VerdictFiling) -> list[VerdictView]:
        from shoal.verify.roles.verdicts import SignedVerdict

        out, guilty = [], []
        free = self.stake.free_stake(verifier)  # a chain read: before the store's lock
        with self.desk.change() as session:
            now = self.desk.now_s()
            job = self.records.proof_job(session, job_id)
            self.stake.check(session, verifier, filing, free)
            name = self.specs.job_spec(job_id, job.job_file).name
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
                planted = self.plants.plant_of(session, job_id, row.worker, row.step) is not None
                if planted and plan.revealed_at_s is not None:
                    row.ruling = Ruling.plant_late  # filed knowing the plants: it tells nothing
                session.add(row)
                session.flush()
                out.append(verdict_view(row))
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
        if guilty:
            self.referee.rule_later(job_id, guilty)
        return out

    def of_job(self, job_id: str) -> list[VerdictView]:
        """The job's verdicts, in the order they were filed, each with its ruling."""
        return job_verdicts(self.store, job_id)


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
