"""Disputes brought by a bonded challenger, a service the coordinator holds:
Truebit's bisection and Verde's refereed delegation, with the money moved
by the contract.

Anyone may dispute a worker's proof epoch: it opens a dispute on the
contract against the worker's provider (`open_dispute`, with its bond),
then files here the state it claims after each of the worker's records of
the epoch (`DisputeFiling`). The claimant's side is the worker's own
records: it stands by every commitment it made, so nobody waits on its
agent. The bisection narrows the two trajectories to the first step they
disagree on, in ⌈log2 n⌉ rounds, and the referee re-executes that one step
(its files fetched from the agents that hold them). The contract then
settles it: upheld, the provider is slashed (its lease unpaid, the
challenger rewarded); rejected, the challenger's bond goes to the treasury.

The challenger commits its whole trajectory at once (n + 1 hashes), so the
bisection runs here in one request; a round-by-round exchange matters where
each answer must be posted on chain, and ours are not. A dispute the
referee cannot decide (the step's files never came) is ruled `undecided`
and left open on chain: it expires after `dispute_timeout_s`, bond back. One
that lands on a forced error (the operator's record, not the provider's) is
not ruled at all, as a plant's guilty verdict is not: a ruling would tell
which records are plants. It too expires on chain.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import select

from shoal.coordinator.db.schema import DisputeRow, JobRow, WorkRecordRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.errors import Conflict, Forbidden, Gone, NotFound
from shoal.coordinator.proofs.challenges import Challenges
from shoal.coordinator.proofs.plants import Plants
from shoal.coordinator.proofs.records import ProofRecords
from shoal.coordinator.proofs.referee import Referee
from shoal.coordinator.proofs.unfiled_disputes import UnfiledDisputes
from shoal.coordinator.proofs.views import dispute_view
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.providers import ProviderOffers
from shoal.coordinator.services.settlement import Settlement
from shoal.ledger import LedgerError
from shoal.proof.epochs import final_lineage
from shoal.proof.errors import DisputeError
from shoal.spec.audit import DisputeFiling, DisputeView
from shoal.spec.coordinator import COORDINATOR
from shoal.spec.events import DISPUTE_RULINGS, DisputeEnforced, DisputeFiled
from shoal.spec.ledger import DisputeState
from shoal.spec.proof import Ruling, Verdict, WorkRecord
from shoal.verify.roles.dispute import bisect_trajectories
from shoal.verify.roles.needed import params_requests, record_files

log = logging.getLogger(__name__)
FETCH_WAIT_S = 30.0  # how long the referee waits for the disputed step's files
BEHIND = "behind"  # a ruling the contract takes only once the lease's older disputes are decided


class Deferred(Exception):
    """The referee cannot rule on the step the bisection left."""

    def __init__(self, ruling: Ruling, step: int, why: str) -> None:
        super().__init__(why)
        self.ruling, self.step, self.why = ruling, step, why


class Disputes:
    """Disputes filed here: bisected, ruled by the referee's replay of one step, and the
    ruling taken to the contract."""

    fetch_wait_s = FETCH_WAIT_S

    def __init__(self, store: Store, desk: MarketDesk, settlement: Settlement | None,
                 records: ProofRecords, plants: Plants, challenges: Challenges,
                 referee: Referee, unfiled: UnfiledDisputes, offers: ProviderOffers) -> None:
        """`plants`: what verifiers are served (a dispute is over that); `challenges`: the
        disputed step's files are asked for as a verifier asks; `unfiled`: a filing past
        its grace is refused; `offers`: an upheld dispute bars and drops the provider."""
        self.store, self.desk, self.settlement = store, desk, settlement
        self.records, self.plants, self.challenges = records, plants, challenges
        self.referee, self.unfiled, self.offers = referee, unfiled, offers
        self.requeue_unruled()

    def requeue_unruled(self) -> None:
        """Disputes filed but not ruled when the coordinator last stopped go back to the
        referee (its queue is memory; those that landed on a plant come back unruled
        again)."""
        with self.store.read() as session:
            waiting = session.execute(select(DisputeRow.job_id, DisputeRow.dispute).where(
                DisputeRow.ruling.is_(None))).all()
        for job_id, dispute in waiting:
            self.referee.later(lambda j=job_id, d=dispute: self.rule_dispute(j, d))

    def file_dispute(self, challenger: str, job_id: str, filing: DisputeFiling) -> DisputeView:
        """Bring a dispute opened on chain: bisect, then the referee replays one step."""
        if self.settlement is None:
            raise Conflict("this coordinator does not settle on a chain: there is no contract "
                           "to hold a dispute's bond")
        with self.store.read() as session:
            job = session.get(JobRow, job_id)
            if job is None:
                raise NotFound(f"no job '{job_id}'")
            if job.chain_job is None:
                raise Conflict(f"job '{job_id}' does not settle on chain: nothing to dispute there")
            if session.get(DisputeRow, filing.dispute) is not None:
                raise Conflict(f"dispute {filing.dispute} was brought already; read its ruling at "
                               f"GET /v1/jobs/{job_id}/proof/disputes")
            provider = session.scalar(select(WorkRecordRow.provider).where(
                WorkRecordRow.job_id == job_id, WorkRecordRow.worker == filing.worker).limit(1))
        if provider is None:
            raise NotFound(f"job '{job_id}' has no work record of worker '{filing.worker}'")
        try:
            opened = self.settlement.ledger.dispute(filing.dispute)
        except LedgerError as error:
            raise NotFound(f"{error}: open it with the contract's open_dispute first") from None
        if opened.challenger.lower() != challenger.lower():
            raise Forbidden(f"dispute {filing.dispute} was opened by {opened.challenger}, not by you")
        if opened.job != job.chain_job or opened.provider.lower() != provider.lower():
            raise Conflict(f"dispute {filing.dispute} accuses {opened.provider} on chain job "
                           f"{opened.job}; worker '{filing.worker}' is {provider}'s, on chain job "
                           f"{job.chain_job}")
        if opened.state is not DisputeState.open:
            raise Conflict(f"dispute {filing.dispute} is {opened.state.name} on chain")
        _, records = self.disputed_records(job_id, filing.worker, filing.epoch)
        if len(filing.trajectory) != len(records) + 1:
            raise Conflict(f"worker '{filing.worker}' has {len(records)} records in proof epoch "
                           f"{filing.epoch}: a trajectory is {len(records) + 1} states (before the "
                           f"first record and after each), not {len(filing.trajectory)}")
        with self.desk.change() as session:  # under the coordinator's lock: one filing wins
            if session.get(DisputeRow, filing.dispute) is not None:
                raise Conflict(f"dispute {filing.dispute} was brought already")
            self.unfiled.check_filing_in_time(opened)  # or rejected unheard (`unfiled_disputes`)
            now = self.desk.now_s()
            row = DisputeRow(dispute=filing.dispute, job_id=job_id, worker=filing.worker,
                             epoch=filing.epoch, challenger=opened.challenger, provider=provider,
                             filed_at_s=now, trajectory=list(filing.trajectory), why="")
            session.add(row)
            record_event(session, now, challenger, DisputeFiled(
                dispute=filing.dispute, worker=filing.worker, epoch=filing.epoch,
                provider=provider, bond_wei=opened.bond_wei), job_id)
            view = dispute_view(row)
        self.referee.later(lambda: self.rule_dispute(job_id, filing.dispute))
        return view

    def of_job(self, job_id: str) -> list[DisputeView]:
        with self.store.read() as session:
            rows = session.scalars(select(DisputeRow).where(DisputeRow.job_id == job_id)
                                   .order_by(DisputeRow.dispute)).all()
            return [dispute_view(row) for row in rows]

    def disputed_records(self, job_id: str, worker: str, epoch: int) -> tuple[bytes, list[WorkRecord]]:
        """The root verifiers are served for `epoch` and `worker`'s records under it (its
        final lineage, in step order): what both trajectories are over."""
        roots = {e.epoch: e.root for e in self.plants.served_epochs(job_id)}
        if epoch not in roots:
            raise Conflict(f"proof epoch {epoch} of job '{job_id}' is not served yet: a dispute "
                           "is over an epoch verifiers can audit")
        records = sorted((r for r in final_lineage(self.plants.served_records(job_id, epoch))
                          if r.worker == worker), key=lambda r: r.step)
        if not records:
            raise NotFound(f"worker '{worker}' has no record in proof epoch {epoch}")
        return bytes.fromhex(roots[epoch][2:]), records

    # ------------------------------------------------------------ the referee's thread
    def rule_dispute(self, job_id: str, dispute: int) -> Ruling:
        with self.store.read() as session:
            row = session.get(DisputeRow, dispute)
            if row is None or row.ruling is not None:
                return Ruling(row.ruling) if row is not None else Ruling.undecided
            worker, epoch, claimed = row.worker, row.epoch, list(row.trajectory)
        root, records = self.disputed_records(job_id, worker, epoch)
        step = rounds = None
        try:
            result = bisect_trajectories(root, records, claimed, lambda r: self._judge(job_id, r))
        except DisputeError as error:
            ruling, why = Ruling.rejected, str(error)
        except Deferred as deferred:
            if deferred.ruling == Ruling.plant:
                # Ruled at once, it would tell the challenger which records are plants (a
                # lazy verifier could learn them with a fabricated trajectory, its bond
                # back at expiry). Left unruled, as a plant's guilty verdict is.
                return Ruling.plant
            ruling, why, step = deferred.ruling, deferred.why, deferred.step
        else:
            step, rounds = result.step, result.rounds
            if result.step is None:
                ruling, why = Ruling.rejected, "the trajectory accepts every step: nothing was disputed"
            elif result.upheld:
                ruling, why = Ruling.upheld, (f"step {result.step}, after {result.rounds} rounds: the "
                                       f"referee's replay found {result.referee_verdict.kind.value}")
            else:
                ruling, why = Ruling.rejected, (f"step {result.step}, after {result.rounds} rounds: the "
                                         "referee's replay matches the worker's commitment")
        self._settle_dispute(job_id, dispute, ruling, why, step, rounds)
        return ruling

    def _judge(self, job_id: str, record: WorkRecord) -> Verdict:
        """The referee's verdict on the one step a bisection left, or Deferred."""
        if self.plants.is_plant(job_id, record.worker, record.step):
            raise Deferred(Ruling.plant, record.step, "the served record of this step is a forced error "
                           "(the operator's, not the provider's): left to expire, bond back")
        self._fetch_step_files(job_id, record)
        ruling, why, verdict = self.referee.replay(job_id, record)
        if ruling == Ruling.upheld and verdict is not None and verdict.guilty:
            return verdict
        if ruling == Ruling.rejected and verdict is not None and not verdict.guilty:
            return verdict
        raise Deferred(Ruling.undecided, record.step, why)

    def _fetch_step_files(self, job_id: str, record: WorkRecord) -> None:
        """Ask the agents for what the step's audit reads (`shoal.verify.roles.needed`:
        its contribution and start parameters; under DiLoCo also the worker's kept states
        of its round), and wait for them up to `fetch_wait_s` (a file a verifier fetched
        already is not asked for again). An agent silent for a while is waited for all
        the same: a ruling is rare, bonded, and must not turn `undecided` because a
        heartbeat came late. One that beats without answering is waited for until its
        silence counts as withholding (the referee's grace), at most `fetch_wait_s`
        more."""
        records = self.records.work_records(job_id)  # a round reaches back, and its next step on
        wanted, starts = record_files([record], records)
        wanted += params_requests(starts, records)
        try:
            asked = {v.challenge for v in self.challenges.raise_challenges(COORDINATOR, job_id, wanted)}
        except (NotFound, Conflict, Gone) as error:  # Gone: past the step's challenge window
            raise Deferred(Ruling.undecided, record.step, f"the step's files cannot be asked for: "
                           f"{error}") from None
        grace = self.referee.withheld_grace_s
        start = time.monotonic()
        while time.monotonic() < start + self.fetch_wait_s + grace:
            waiting = [(v, seen) for v, seen in self.challenges.held(job_id, asked)
                       if v.answered_at_s is None]
            if not waiting:
                return
            # A holder that beats on without answering is not waited out: the referee's
            # `withheld` rule needs it seen alive `grace` seconds after the challenge,
            # so ruling before would let a cheat that goes quiet for `fetch_wait_s` turn
            # the dispute `undecided` (its bond back, the cheat unslashed). Once every
            # silence counts, waiting longer changes nothing; after `fetch_wait_s`, only
            # a holder seen since it was asked, but not yet past the grace, is waited for.
            if all(seen > v.requested_at_s + grace for v, seen in waiting):
                return
            if time.monotonic() >= start + self.fetch_wait_s and not any(
                    v.requested_at_s < seen <= v.requested_at_s + grace for v, seen in waiting):
                return
            time.sleep(0.2)

    def _settle_dispute(self, job_id: str, dispute: int, ruling: Ruling, why: str,
                        step: int | None, rounds: int | None) -> None:
        note, chain_state, held = self._enforce(dispute, ruling)
        with self.desk.change() as session:
            row = session.get(DisputeRow, dispute)
            row.ruling, row.step, row.rounds = ruling, step, rounds
            row.why = f"{why} ({held})" if held else why
            row.tx, row.chain_state = note.get("tx"), chain_state
            provider = row.provider
            record_event(session, self.desk.now_s(), COORDINATOR, DISPUTE_RULINGS[ruling](
                dispute=dispute, worker=row.worker, step=step, provider=provider,
                challenger=row.challenger, why=why, chain=held or chain_state, **note), job_id)
        if ruling == Ruling.upheld and self.referee.penalties.first_slash(job_id, provider):
            self.offers.bar_provider(job_id, provider, reason=f"slashed in dispute {dispute}: {why}")
            self.offers.drop_provider(job_id, provider, reason=f"slashed in dispute {dispute}: {why}")
        log.warning("job %s: dispute %d on %s %s at step %s: %s", job_id, dispute, row.worker,
                    ruling, step, row.why)

    def _enforce(self, dispute: int, ruling: Ruling) -> tuple[dict[str, str], str | None, str]:
        """Move the money for a ruling: (the transaction's note, the dispute's state on
        chain once final, what holds it back while it is not)."""
        referee, ledger = self.referee, self.settlement.ledger
        with self.store.read() as session:
            row = session.get(DisputeRow, dispute)
            provider, challenger = row.provider, row.challenger
            chain_job = session.get(JobRow, row.job_id).chain_job
        if ruling not in (Ruling.upheld, Ruling.rejected):
            return {}, None, "not ruled: it expires on chain, bond back"
        if referee.account is None:
            return {}, None, "this coordinator holds no referee key: not enforced on chain"
        state = ledger.dispute(dispute).state
        if state is not DisputeState.open:
            return {}, state.name, ""
        note = referee.penalties.transact(lambda: ledger.resolve_dispute(
            referee.account, dispute, upheld=ruling == Ruling.upheld))
        if "tx" in note:
            return note, ledger.dispute(dispute).state.name, ""
        if "earlier dispute" not in note.get("chain_error", ""):
            return note, None, "the contract refused the ruling"
        # The contract decides a lease's disputes oldest first, and an older one may wait
        # unruled (one that landed on a forced error, or whose files never came).
        if ruling == Ruling.upheld:
            # A slash always goes through: it closes the lease's open disputes (bonds
            # back) and rewards the challenger named here.
            note = referee.penalties.transact(lambda: ledger.slash(referee.account, chain_job, provider,
                                                         challenger))
            return note, ledger.dispute(dispute).state.name if "tx" in note else None, \
                "an earlier dispute on the lease is open: slashed directly"
        return {}, BEHIND, "an earlier dispute on the lease is open: resolved once it is decided"

    def enforce_rulings(self) -> None:
        """Take to the chain the rulings that waited behind an older open dispute on their
        lease (a rejected one); stop once the chain has the final word."""
        if self.settlement is None or self.referee.account is None:
            return
        with self.store.read() as session:
            pending = session.execute(select(DisputeRow.dispute, DisputeRow.job_id,
                                             DisputeRow.ruling).where(
                DisputeRow.chain_state == BEHIND)).all()
        for dispute, job_id, ruling in pending:
            note, chain_state, _ = self._enforce(dispute, ruling)
            if chain_state == BEHIND:
                continue
            with self.desk.change() as session:
                row = session.get(DisputeRow, dispute)
                row.chain_state, row.tx = chain_state, note.get("tx", row.tx)
                record_event(session, self.desk.now_s(), COORDINATOR, DisputeEnforced(
                    dispute=dispute, ruling=ruling, chain=chain_state, **note), job_id)
