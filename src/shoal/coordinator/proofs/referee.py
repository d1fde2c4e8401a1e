"""The referee at the coordinator: a guilty verdict filed by a verifier is
ruled on by re-executing that one step (Verde's refereed delegation), on
the files the verifier itself was given, and the ruling moves money
through the contract (penalties.py): an upheld verdict slashes the worker's
provider (its lease unpaid, its collateral to the whistleblower and the
submitter), a rejected one costs the accusing verifier part of its stake.

Rulings run on a thread of their own: a replay takes a second or more and
the API must not wait for it. Without a referee key the coordinator only
records verdicts; someone else must take them to the contract.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eth_account.signers.local import LocalAccount
from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.db.store import Store
from shoal.coordinator.proofs.penalties import Penalties
from shoal.coordinator.proofs.plants import Plants
from shoal.coordinator.proofs.records import ProofRecords
from shoal.coordinator.services.job_specs import JobSpecs
from shoal.coordinator.db.schema import (
    AgentRow, ChallengeRow, LeaseRow, OfferRow, VerdictRow, WorkRecordRow,
)
from shoal.proof.epochs import epoch_of, final_lineage
from shoal.spec.audit import BlobKind
from shoal.spec.job import JobSpec
from shoal.spec.plan import SyncMode
from shoal.spec.proof import Ruling, Verdict, VerdictKind, WorkRecord
from shoal.spec.worker import WorkerId
from shoal.verify.audit.unrecorded_round import record_less_rounds

if TYPE_CHECKING:
    from shoal.verify.audit.record import Auditor
    from shoal.verify.replay import Replayer

log = logging.getLogger(__name__)
# Jobs whose record-less DiLoCo rounds the referee keeps an auditor for (each holds a
# replica of the job's model and the round starts it loaded).
ROUND_AUDITORS_KEPT = 4


class Referee:
    def __init__(self, store: Store, specs: JobSpecs, records: ProofRecords, plants: Plants,
                 penalties: Penalties, replayer: Callable[[JobSpec], Replayer] | None,
                 withheld_grace_s: float = 30.0) -> None:
        """`penalties`: what each ruling costs whom (they hold the contract's referee key);
        `plants`: which records are the operator's forced errors, never ruled on here;
        `replayer`: builds a job's replayer (None: only withheld verdicts can be ruled on)."""
        self.store, self.specs, self.records, self.plants = store, specs, records, plants
        self.penalties, self.replayer = penalties, replayer
        self.withheld_grace_s = withheld_grace_s
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="shoal-referee")
        self._round_auditors: dict[str, Auditor] = {}  # DiLoCo jobs' record-less rounds

    @property
    def account(self) -> LocalAccount | None:
        """The contract's referee key (None: rulings are recorded, not enforced)."""
        return self.penalties.account

    @account.setter
    def account(self, account: LocalAccount | None) -> None:
        self.penalties.account = account

    def rule_later(self, job_id: str, verdicts: list[int]) -> None:
        self._executor.submit(self._rule_all, job_id, verdicts)

    def later(self, ruling: Callable[[], object]) -> None:
        """Run `ruling` on the referee's thread, after what is queued (a dispute's)."""
        def run() -> None:
            try:
                ruling()
            except Exception:  # noqa: BLE001 - one failed ruling must not stop the next
                log.exception("a ruling failed; it stays undecided")
        self._executor.submit(run)

    def wait(self) -> None:
        """Rule on everything filed so far (tests, shutdown)."""
        self._executor.submit(lambda: None).result()

    def _rule_all(self, job_id: str, verdicts: list[int]) -> None:
        ruled: list[Ruled] = []
        for seq in verdicts:
            try:
                ruled.append(self._rule(job_id, seq))
            except Exception:  # noqa: BLE001 - one failed ruling must not stop the next
                log.exception("job %s: ruling on verdict %d failed; it stays undecided", job_id, seq)
        log_rulings(job_id, ruled)

    def rule(self, job_id: str, seq: int) -> Ruling:
        """Rule on verdict `seq` now, and log the ruling; the ruling."""
        ruled = self._rule(job_id, seq)
        log_rulings(job_id, [ruled])
        return ruled.ruling

    def _rule(self, job_id: str, seq: int) -> Ruled:
        with self.store.read() as session:
            row = session.get(VerdictRow, seq)
            if row is None or row.ruling is not None:
                return Ruled(Ruling(row.ruling) if row else Ruling.undecided)
            verdict = Verdict.model_validate(row.body["verdict"])
            filed_at_s = row.at_s
            record_row = session.get(WorkRecordRow, (job_id, verdict.worker, verdict.step))
        record = WorkRecord.model_validate(record_row.body) if record_row else None
        vouched = vouched_steps(record, verdict.step)
        if any(self.plants.is_plant(job_id, verdict.worker, step) for step in vouched):
            # A planted record is the operator's: its verdicts are scored at the reveal
            # (plants.py), and a replay of the worker's real record must not rule on them
            # (nor on a DiLoCo round's end whose audit read a plant of its round).
            return Ruled(Ruling.plant)
        epoch = epoch_of(verdict.step, self.specs.job_spec(job_id).proof.epoch_steps)
        records = self.records.work_records(job_id, epoch)
        provider = record_row.provider if record_row is not None else None
        if record is None or record not in final_lineage(records):
            # A record the step's final lineage does not take shields nothing: a worker
            # could file one under another epoch it is a member of, and have the
            # replay of that record reject a true verdict on the share it really sent.
            ruling, why, provider = self.unrecorded(job_id, verdict, records, filed_at_s)
        elif verdict.kind is VerdictKind.withheld:
            ruling, why = self.withheld(job_id, verdict, record_row.agent_id, vouched,
                                        filed_at_s=filed_at_s)
            if ruling == Ruling.answered_late:
                # Answered after the verifier gave up and filed: neither withholding nor a
                # false accusation by itself. What the file shows decides: a cheat that
                # answers late to dodge its audit is still caught.
                ruling, replayed, _ = self.replay(job_id, record, records)
                if ruling == Ruling.rejected:
                    ruling = Ruling.undecided
                    why = f"{why}; the referee's replay matches the commitment: nobody is at fault"
                else:
                    why = f"{why}; {replayed}"
        else:
            ruling, why, _ = self.replay(job_id, record, records)
        self.penalties.enforce(job_id, seq, verdict, ruling, why, provider)
        return Ruled(ruling, why, verdict.worker, verdict.step, verdict.verifier)

    def withheld(self, job_id: str, verdict: Verdict, agent_id: str,
                 steps: range | None = None, filed_at_s: float | None = None) -> tuple[Ruling, str]:
        """Withheld stands only if the agent was alive and beating while it did not answer:
        a provider whose machine died is not a cheat, it just loses what it cannot show.
        `steps`: the worker's steps whose files the record's audit needs (its own, or
        under DiLoCo a round's end: its round's). `filed_at_s`: when the verdict was
        filed; a challenge answered after that gives Ruling.answered_late (the caller replays)."""
        steps = steps or range(verdict.step, verdict.step + 1)
        with self.store.read() as session:
            asked = own_file_challenges(session, job_id, verdict.worker, steps)
            agent = session.get(AgentRow, agent_id)
        unanswered = [c for c in asked if c.answered_at_s is None]
        if not asked:
            return Ruling.rejected, "nobody challenged that record: nothing was withheld"
        if not unanswered:
            last = max(c.answered_at_s for c in asked)
            if filed_at_s is not None and last >= filed_at_s:
                # The verifier waited and filed with the file still missing; an honest
                # verifier must not pay for an agent that answered after it gave up.
                return Ruling.answered_late, (f"answered {last - filed_at_s:.1f} s after the verdict "
                                       "was filed")
            return Ruling.rejected, "the challenge was answered before the verdict was filed"
        challenge = min(unanswered, key=lambda c: c.requested_at_s)
        if agent is not None and agent.last_seen_s > challenge.requested_at_s + self.withheld_grace_s:
            return Ruling.upheld, f"agent beat {agent.last_seen_s - challenge.requested_at_s:.1f} s after " \
                           "the challenge and did not answer it"
        if agent is not None and agent.last_seen_s > challenge.requested_at_s:
            return Ruling.undecided, (f"the agent beat after the challenge, but not yet "
                               f"{self.withheld_grace_s:g} s after it, when its silence would "
                               "count: filed too early to be ruled withheld")
        return Ruling.undecided, "the agent has been silent since the challenge: not ruled a cheat"

    def replay(self, job_id: str, record: WorkRecord, records: list[WorkRecord] | None = None
               ) -> tuple[Ruling, str, Verdict | None]:
        """The referee's own audit of one record: (ruling, why, its verdict if it replayed).
        `records`: the record's proof epoch's, if the caller has them already."""
        from shoal.verify.roles.verifier import Verifier
        from shoal.spec.proof import hyper_digest
        from shoal.verify.audit.record import Auditor
        from shoal.verify.proof_store import ProofStore

        spec = self.specs.job_spec(job_id)
        epoch = epoch_of(record.step, spec.proof.epoch_steps)
        records = self.records.work_records(job_id, epoch) if records is None else records
        if record not in final_lineage(records):
            return Ruling.rejected, ("the record is of a lineage abandoned after a restore (its step "
                              "was redone in a later membership epoch): not audited, not blamed"), None
        if self.replayer is None:
            return Ruling.undecided, "this coordinator has no replayer for the job's model", None
        roots = {e.epoch: bytes.fromhex(e.root[2:]) for e in self.records.proof_epochs(job_id)}
        if epoch not in roots:
            return Ruling.undecided, f"proof epoch {epoch} is not rooted yet", None
        auditor = Auditor(ProofStore(self.records.proof_dir(job_id)), self.replayer(spec),
                          hyper_sha256=hyper_digest(spec.hyperparameters()),
                          tolerance=spec.proof.tolerance, verifier="referee",
                          records=lambda: self.records.work_records(job_id))
        # The job's published membership: a break in the chain of steps falls on the
        # state source its host named (before, the referee knew none and could only replay
        # the source's record, which agrees with its own claims: never upheld).
        published = self.records.published
        judge = Verifier(auditor, spec.proof, salt=b"", roots=roots.get, total_steps=spec.steps,
                         members=lambda e: published.members(job_id, e),
                         sources=lambda e: published.state_source(job_id, e))
        found = judge.audit_one(record, records)
        if found.kind is VerdictKind.unavailable:
            return Ruling.undecided, f"the referee could not replay: {found.detail}", found
        if found.kind is VerdictKind.withheld:
            # No reveal here is the worker's fault only if it was asked and did not answer:
            # else an accuser could name a record nobody challenged and have it "withheld".
            with self.store.read() as session:
                row = session.get(WorkRecordRow, (job_id, record.worker, record.step))
            ruling, why = self.withheld(job_id, found, row.agent_id if row else "",
                                        _vouched(record))
            return ruling, f"its contribution is not revealed here: {why}", found
        if found.guilty:
            return Ruling.upheld, f"the referee's replay found {found.kind.value}", found
        return Ruling.rejected, "the referee's replay matches the commitment", found

    def unrecorded(self, job_id: str, verdict: Verdict, records: list[WorkRecord],
                   filed_at_s: float | None = None) -> tuple[Ruling, str, str | None]:
        """A verdict on a worker with no record of the step: its share, if it held a seat
        in the step and filed nothing in the step's final lineage, is replayed as the
        verifier did (`shoal.verify.audit.unrecorded`). `records`: the step's proof
        epoch's; `filed_at_s`: when the verdict was filed. (ruling, why, its provider)."""
        from shoal.spec.proof import hyper_digest
        from shoal.verify.audit.record import Auditor
        from shoal.verify.audit.unrecorded import unrecorded_shares
        from shoal.verify.proof_store import ProofStore

        named = WorkerId.leased(verdict.worker)
        with self.store.read() as session:
            lease = session.get(LeaseRow, named.lease) if named is not None else None
            if lease is not None and lease.job_id != job_id:
                lease = None
            provider = lease.provider if lease is not None else None
            offer = session.get(OfferRow, lease.offer_id) if lease is not None else None
        spec = self.specs.job_spec(job_id)
        diloco = spec.sync.mode is SyncMode.diloco
        epoch = epoch_of(verdict.step, spec.proof.epoch_steps)
        step_records = [r for r in final_lineage(records) if r.step == verdict.step]
        members = lambda e: self.records.published.members(job_id, e)  # noqa: E731
        shares = [share for share in unrecorded_shares(step_records, members)
                  if share.worker == verdict.worker]
        if not shares:
            return Ruling.rejected, ("the accused record does not exist, and the worker held no seat "
                              "of the step that went without a record"), provider
        if epoch not in {e.epoch for e in self.records.proof_epochs(job_id)}:
            return Ruling.undecided, f"proof epoch {epoch} is not rooted yet", provider
        if self.replayer is None:
            return Ruling.undecided, "this coordinator has no replayer for the job's model", provider
        # Under DiLoCo one auditor per job: it remembers the round ends it replayed, so a
        # worker with many record-less rounds costs each ruling one round, not all of them.
        auditor = self._round_auditors.pop(job_id, None) if diloco else None
        if auditor is None:
            auditor = Auditor(ProofStore(self.records.proof_dir(job_id)), self.replayer(spec),
                              hyper_sha256=hyper_digest(spec.hyperparameters()),
                              tolerance=spec.proof.tolerance, verifier="referee",
                              records=lambda: self.records.work_records(job_id))
        if diloco:
            self._round_auditors[job_id] = auditor  # the newest last: the oldest goes first
            while len(self._round_auditors) > ROUND_AUDITORS_KEPT:
                self._round_auditors.pop(next(iter(self._round_auditors)))
        found = auditor.audit_unrecorded(shares[0], epoch, step_records, members)
        if found.kind is VerdictKind.withheld:
            # A state its round needs is not here: withheld stands only if the worker's
            # agent was alive while it did not answer (as for a recorded step).
            ruling, why = self.withheld(job_id, verdict, offer.agent_id if offer else "",
                                        self._round_steps(job_id, verdict))
            return ruling, why, provider
        if found.kind is VerdictKind.unavailable:
            return Ruling.undecided, f"the referee could not replay: {found.detail}", provider
        if found.guilty:
            return Ruling.upheld, f"the referee's replay found {found.kind.value}: {found.detail}", \
                provider
        why = "the referee's replay matches what the worker declared"
        if verdict.kind is VerdictKind.withheld and filed_at_s is not None:
            # Withheld, and the files are here now: a false accusation only if they were in
            # before the verdict was filed (else the agent answered after the verifier gave up).
            ruling, when = self.withheld(job_id, verdict, offer.agent_id if offer else "",
                                         self._round_steps(job_id, verdict), filed_at_s)
            if ruling == Ruling.answered_late:
                return Ruling.undecided, f"{when}; {why}: nobody is at fault", provider
        return Ruling.rejected, why, provider

    def _round_steps(self, job_id: str, verdict: Verdict) -> range:
        """The steps whose kept states judging a record-less DiLoCo round reads: its own,
        and its worker's earlier record-less rounds'."""
        lineage: dict[int, list[WorkRecord]] = defaultdict(list)
        for record in final_lineage(self.records.work_records(job_id)):
            lineage[record.step].append(record)
        spans = record_less_rounds(verdict.worker, verdict.step, lineage)
        return range(spans[0].start if spans else verdict.step, verdict.step + 1)

def own_file_challenges(session: Session, job_id: str, worker: str,
                        steps: range) -> list[ChallengeRow]:
    """The challenges of a worker's own files at `steps`: its contributions, and under
    DiLoCo the states its steps started from (what a `withheld` verdict says it kept back)."""
    return list(session.scalars(select(ChallengeRow).where(
        ChallengeRow.job_id == job_id, ChallengeRow.worker == worker,
        ChallengeRow.step >= steps.start, ChallengeRow.step < steps.stop,
        ChallengeRow.kind.in_([BlobKind.reveal.value, BlobKind.local.value]))).all())


def vouched_steps(record: WorkRecord | None, step: int) -> range:
    """The worker's steps a verdict on its record at `step` vouches for (see `_vouched`)."""
    return _vouched(record) if record is not None else range(step, step + 1)


def _vouched(record: WorkRecord) -> range:
    """The steps whose files a record's audit reads: its own, or under DiLoCo a round's
    end vouches for the worker's whole round (`shoal.verify.audit.local`)."""
    if record.local is not None and record.local.outer:
        return range(record.local.round_start, record.step + 1)
    return range(record.step, record.step + 1)


@dataclass(frozen=True)
class Ruled:
    """A ruling as the log tells it: on which worker's step, whose verdict, and why (a
    verdict ruled already, or left to a plant's reveal, has no worker: nothing new)."""

    ruling: Ruling
    why: str = ""
    worker: str | None = None
    step: int = -1
    verifier: str = ""


def log_rulings(job_id: str, ruled: list[Ruled]) -> None:
    """One line per verifier, worker, ruling and reason, not one per verdict: a provider
    whose machine died leaves every challenged step of its worker undecided, and a cheat
    every audited one upheld, each ruling on record in the job's events already.
    Rulings that moved money (upheld, rejected) are warnings."""
    steps: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)
    for r in ruled:
        if r.worker is not None:
            steps[(r.verifier, r.worker, r.ruling, r.why)].append(r.step)
    for (verifier, worker, ruling, why), at in steps.items():
        level = logging.INFO if ruling == Ruling.undecided else logging.WARNING
        shown = ", ".join(map(str, at[:3])) + (f", … {at[-1]}" if len(at) > 3 else "")
        log.log(level, "job %s: %s by %s on %s %s (step%s %s): %s", job_id,
                "a verdict" if len(at) == 1 else f"{len(at)} verdicts", verifier or "?", worker,
                ruling, "" if len(at) == 1 else "s", shown, why)
