"""What the referee's rulings cost, a service the coordinator holds (and hands the
referee, the plants' reveal and the disputes).

An upheld verdict slashes the worker's provider through the contract (its
lease unpaid, its collateral to the verifier and the submitter), once per job,
and bars it from the job; every verifier that signed `valid` on that record
loses stake to the one shown right. A rejected verdict costs its verifier stake
for the false accusation; a verifier that signed `valid` on a forced error
loses as much (plants.py). Without the referee's key nothing is sent to the
chain: the rulings are only recorded.
"""

from __future__ import annotations

import logging

from eth_account.signers.local import LocalAccount

from shoal.coordinator.db.schema import JobRow, VerdictRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.proofs.views import job_verdicts
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.providers import ProviderOffers
from shoal.coordinator.services.settlement import Settlement
from shoal.ledger import LedgerError
from shoal.spec.coordinator import COORDINATOR
from shoal.spec.events import VERDICT_RULINGS, VerdictUndecided, VerifierSlashed, WorkerSlashed
from shoal.spec.proof import Ruling, Verdict, VerdictKind

log = logging.getLogger(__name__)
# A verifier that accused falsely loses this much stake (wei), part of it to the accused;
# one that signed `valid` on work a replay shows wrong loses as much, part of it to the
# verifier (or whistleblower) whose verdict was upheld.
FALSE_ACCUSATION_PENALTY_WEI = 10**15
LAZY_VERDICT_PENALTY_WEI = 10**15


class Penalties:
    def __init__(self, store: Store, desk: MarketDesk, settlement: Settlement | None,
                 offers: ProviderOffers, account: LocalAccount | None) -> None:
        """`account`: the contract's referee key (None: rulings are recorded, not enforced);
        `settlement` None: escrow is the store's bookkeeping only, nothing is slashed;
        `offers`: bars a slashed provider from the job and withdraws its offers."""
        self.store, self.desk, self.settlement, self.offers = store, desk, settlement, offers
        self.account = account
        self._slashed: set[tuple[str, str]] = set()  # (job, provider) slashed already
        self._lazy_seen: set[tuple[str, str, str, int]] = set()  # (job, verifier, worker, step)

    def first_slash(self, job_id: str, provider: str) -> bool:
        """Whether `provider` is slashed in `job_id` for the first time (then noted)."""
        if (job_id, provider) in self._slashed:
            return False
        self._slashed.add((job_id, provider))
        return True

    def enforce(self, job_id: str, seq: int, verdict: Verdict, ruling: Ruling, why: str,
                provider: str | None) -> None:
        """Carry out the referee's ruling on verdict `seq`: store it, with an event, and
        slash (the worker's provider, once per job, or lazy or accusing verifiers)."""
        chain_note: dict[str, str] = {}
        with self.store.read() as session:
            job = session.get(JobRow, job_id)
        chain_job = job.chain_job if job is not None else None
        enforce = self.account is not None and self.settlement is not None and chain_job is not None
        kind = VERDICT_RULINGS.get(ruling, VerdictUndecided)
        if ruling == Ruling.upheld and provider is not None and (job_id, provider) not in self._slashed \
                and not (enforce and self.settlement.ledger.lease(chain_job, provider).slashed):
            self._slashed.add((job_id, provider))
            kind = WorkerSlashed  # the first upheld verdict; later ones are on record only
            if enforce:
                chain_note = self.transact(lambda: self.settlement.ledger.slash(
                    self.account, chain_job, provider, verdict.verifier))
            self.offers.bar_provider(job_id, provider, reason=f"slashed: {why}")
            self.offers.drop_provider(job_id, provider, reason=f"slashed: {why}")
        if ruling == Ruling.upheld:
            self._lazy_verifiers(job_id, verdict, enforce, chain_job)
        elif ruling == Ruling.rejected and self.account is not None \
                and self.settlement is not None:
            # Whether or not the job's escrow is on the chain: the verifier's stake is
            # (verdict_stake.py took its verdict only while that stake covered it).
            chain_note = self.transact(lambda: self.settlement.ledger.slash_verifier(
                self.account, verdict.verifier, FALSE_ACCUSATION_PENALTY_WEI,
                provider or self.settlement.operator.address))
        with self.desk.change() as session:
            session.get(VerdictRow, seq).ruling = ruling
            record_event(session, self.desk.now_s(), COORDINATOR, kind(
                verdict=seq, worker=verdict.worker, step=verdict.step, verifier=verdict.verifier,
                provider=provider, why=why, **chain_note), job_id)
        if kind is WorkerSlashed:
            log.warning("job %s: provider %s slashed for %s's step %d: %s", job_id, provider,
                        verdict.worker, verdict.step, why)

    def _lazy_verifiers(self, job_id: str, upheld: Verdict, enforce: bool,
                        chain_job: int | None) -> None:
        """Verifiers that signed `valid` on the record whose guilty verdict stands."""
        for view in job_verdicts(self.store, job_id):
            v = view.verdict
            key = (job_id, v.verifier, v.worker, v.step)
            # Only a `valid` was wrong: `unavailable` (no parameters to replay from, when it
            # looked) concluded nothing, and a guilty kind agrees with the upheld one.
            if (v.worker, v.step) != (upheld.worker, upheld.step) \
                    or v.kind is not VerdictKind.valid \
                    or v.verifier.lower() == upheld.verifier.lower() or key in self._lazy_seen:
                continue
            self._lazy_seen.add(key)
            note = self.transact(lambda: self.settlement.ledger.slash_verifier(
                self.account, v.verifier, LAZY_VERDICT_PENALTY_WEI, upheld.verifier)) \
                if enforce else {}
            with self.desk.change() as session:
                record_event(session, self.desk.now_s(), COORDINATOR, VerifierSlashed(
                    verifier=v.verifier, worker=v.worker, step=v.step, shown_by=upheld.verifier,
                    **note), job_id)
            log.warning("job %s: verifier %s signed valid on %s step %d, shown wrong by %s",
                        job_id, v.verifier, v.worker, v.step, upheld.verifier)

    def penalise_missed_plant(self, verifier: str, to: str) -> dict[str, str]:
        """A verifier signed `valid` on a forced error: it loses stake, part of it to `to`."""
        if self.account is None or self.settlement is None:
            return {}
        return self.transact(lambda: self.settlement.ledger.slash_verifier(
            self.account, verifier, LAZY_VERDICT_PENALTY_WEI, to))

    @staticmethod
    def transact(send) -> dict[str, str]:  # noqa: ANN001 - a thunk sending one transaction
        try:
            outcome = send()
        except LedgerError as error:
            log.error("the contract refused the ruling: %s", error)
            return {"chain_error": str(error)}
        return {"tx": outcome.tx_hash}
