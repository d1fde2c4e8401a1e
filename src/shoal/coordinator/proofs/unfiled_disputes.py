"""On-chain disputes nobody brings to the referee, rejected unheard once a grace has
passed: a service the coordinator holds.

Opening a dispute on the contract (`open_dispute`, with a bond) freezes the
accused provider's pay until the referee decides it or `dispute_timeout_s`
(days) passes, when the bond goes back. A dispute is decided only once its
challenger files its trajectory here (`Disputes.file_dispute`). So one
that is opened and never filed froze an honest provider's pay for days at the
cost of gas, and `MAX_OPEN_DISPUTES` of them kept every honest challenger off
the lease. The referee now rejects a dispute on one of its jobs that nobody
filed within `unfiled_dispute_grace_s` of its opening: the contract sends the
bond to the treasury, as for any false accusation. A filing after the grace is
refused, so a challenger learns at once, not from its lost bond, that it is late.
The grace runs from the opening or from when this coordinator started reading
the chain, whichever is later: a dispute opened while it was down (nobody could
file it) gets the whole grace after it is back.

Disputes are read by id, from the first this coordinator has not finished with:
after a restart, every dispute of the contract is read once again.
"""

from __future__ import annotations

import logging

from sqlalchemy import select

from shoal.coordinator.errors import Conflict
from shoal.coordinator.db.schema import DisputeRow, JobRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.proofs.penalties import Penalties
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.settlement import Settlement
from shoal.coordinator.settings import CoordinatorSettings
from shoal.ledger import LedgerError
from shoal.spec.coordinator import COORDINATOR
from shoal.spec.events import DisputeDismissed
from shoal.spec.ledger import Dispute, DisputeState

log = logging.getLogger(__name__)


class UnfiledDisputes:
    """The contract's open disputes on this coordinator's jobs that nobody filed here."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 settlement: Settlement | None, penalties: Penalties) -> None:
        """`penalties`: hold the referee's key, which rejects a dispute on the contract."""
        self.store, self.desk, self.settings = store, desk, settings
        self.settlement, self.penalties = settlement, penalties
        self._next_dispute = 1  # the first dispute id not read yet
        self._reading_since: int | None = None  # chain time of our first read of disputes
        # open, on our jobs, not filed (yet): id -> (our job, the dispute as opened)
        self._watched: dict[int, tuple[str, Dispute]] = {}
        self._dismissed: set[int] = set()  # rejected unheard (or being): never filed now

    def check_filing_in_time(self, opened: Dispute) -> None:
        """Refuse (Conflict) a filing of a dispute that could have been filed here for
        longer than the grace: since its opening, or since this coordinator started."""
        late_s = self._waited_s(opened, self._chain_now())
        grace = self.settings.unfiled_dispute_grace_s
        if opened.dispute in self._dismissed or late_s > grace:
            raise Conflict(f"dispute {opened.dispute} waited {late_s} s on chain: a dispute "
                           f"is brought within {grace:g} s of opening it, or the referee "
                           "rejects it unheard (its bond to the treasury)")

    def _chain_now(self) -> int:
        """Chain time; the first read is when this coordinator began to take filings."""
        now = self.settlement.ledger.chain.now()
        if self._reading_since is None:
            self._reading_since = now
        return now

    def _waited_s(self, opened: Dispute, now: int) -> int:
        """Chain seconds `opened` could have been filed here for."""
        return now - max(opened.opened_at, self._reading_since)

    def dismiss_unfiled_disputes(self) -> None:
        """Once a round: reject, oldest first, each open dispute on one of our jobs that
        nobody filed within the grace. One the contract takes only after an older one on
        its lease is decided (filed and still being ruled, or left to expire) is tried
        again next round."""
        if self.settlement is None or self.penalties.account is None:
            return
        ledger = self.settlement.ledger
        try:
            count = ledger.dispute_count()
            if self._reading_since is not None and count < self._next_dispute and \
                    not self._watched:
                return  # nothing new, nothing waiting: one call a round
            now = self._chain_now()
            if count >= self._next_dispute:
                self._watch(range(self._next_dispute, count + 1))
                self._next_dispute = count + 1
        except LedgerError as error:  # the node is down: next round
            log.error("reading the contract's disputes failed: %s", error)
            return
        grace = self.settings.unfiled_dispute_grace_s
        for dispute, (job_id, opened) in sorted(self._watched.items()):
            if self._waited_s(opened, now) > grace and self._dismiss(job_id, opened):
                del self._watched[dispute]

    def _watch(self, disputes: range) -> None:
        """Watch those of `disputes` that are open on one of our jobs."""
        with self.store.read() as session:
            ours = {chain_job: job_id for chain_job, job_id in session.execute(
                select(JobRow.chain_job, JobRow.job_id).where(JobRow.chain_job.is_not(None)))}
        for dispute in disputes:
            opened = self.settlement.ledger.dispute(dispute)
            if opened.state is DisputeState.open and opened.job in ours:
                self._watched[dispute] = (ours[opened.job], opened)

    def _dismiss(self, job_id: str, opened: Dispute) -> bool:
        """Reject `opened` unheard unless it was filed; True once nothing is left to do."""
        with self.desk.change() as session:  # under the lock `file_dispute` inserts under
            if session.get(DisputeRow, opened.dispute) is not None:
                return True  # brought in time: the referee rules it
            self._dismissed.add(opened.dispute)
        ledger, penalties = self.settlement.ledger, self.penalties
        try:
            if ledger.dispute(opened.dispute).state is not DisputeState.open:
                return True  # expired, or closed by a slash of its lease
        except LedgerError as error:
            log.error("reading dispute %d failed: %s", opened.dispute, error)
            return False
        note = penalties.transact(lambda: ledger.resolve_dispute(
            penalties.account, opened.dispute, upheld=False))
        if "tx" not in note:
            return False  # an older dispute on the lease goes first; or the node is down
        why = (f"nobody brought it to the referee within {self.settings.unfiled_dispute_grace_s:g}"
               " s of its opening")
        with self.desk.change() as session:
            record_event(session, self.desk.now_s(), COORDINATOR, DisputeDismissed(
                dispute=opened.dispute, provider=opened.provider, challenger=opened.challenger,
                bond_wei=opened.bond_wei, opened_at=opened.opened_at, why=why, **note), job_id)
        log.warning("job %s: dispute %d on %s rejected unheard: %s", job_id, opened.dispute,
                    opened.provider, why)
        return True
