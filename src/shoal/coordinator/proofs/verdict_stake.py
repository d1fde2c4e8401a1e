"""Stake before verdicts: where the coordinator settles on a chain, a verifier's
verdicts are taken only while its free stake there covers what they could cost it.

A rejected guilty verdict costs its verifier FALSE_ACCUSATION_PENALTY_WEI, and a
`valid` signed on a forced error LAZY_VERDICT_PENALTY_WEI (penalties.py), taken
from the stake its leases do not lock. A verifier with none would accuse for
free: every false accusation sets the referee replaying a step and freezes the
accused's standing until it is ruled. So a filing needs free stake of one
penalty for each guilty verdict it holds and each of the verifier's guilty
verdicts still awaiting a ruling, and never less than one penalty. (Off a chain
no one holds stake, and a ruling only records.)
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import VerdictRow
from shoal.coordinator.errors import Conflict
from shoal.coordinator.proofs.penalties import (
    FALSE_ACCUSATION_PENALTY_WEI, LAZY_VERDICT_PENALTY_WEI,
)
from shoal.coordinator.services.settlement import Settlement
from shoal.spec.audit import VerdictFiling
from shoal.spec.proof import GUILTY


class VerdictStake:
    def __init__(self, settlement: Settlement | None) -> None:
        self.settlement = settlement

    def free_stake(self, verifier: str) -> int | None:
        """`verifier`'s stake on the chain that its leases do not lock (None: off chain).
        A chain read: done before the store's lock is taken."""
        if self.settlement is None:
            return None
        stake = self.settlement.ledger.stake_of(verifier)
        return stake.active_wei - stake.locked_wei

    def check(self, session: Session, verifier: str, filing: VerdictFiling,
              free: int | None) -> None:
        """Refuse (Conflict) `filing` unless `free` (free_stake's) covers it with the
        verifier's guilty verdicts awaiting a ruling; in the filing's own transaction, so
        filings sent at once cannot each count on the same stake."""
        if free is None:
            return
        awaiting = session.scalar(select(func.count()).select_from(VerdictRow).where(
            VerdictRow.verifier == verifier, VerdictRow.ruling.is_(None),
            VerdictRow.kind.in_([kind.value for kind in GUILTY])))
        guilty = sum(body.verdict.guilty for body in filing.verdicts)
        needed = max(LAZY_VERDICT_PENALTY_WEI, FALSE_ACCUSATION_PENALTY_WEI * (awaiting + guilty))
        if free < needed:
            raise Conflict(
                f"your free stake of {free} wei does not cover these verdicts: {guilty} "
                f"guilty here and {awaiting} awaiting a ruling need {needed} wei (a false "
                f"accusation costs {FALSE_ACCUSATION_PENALTY_WEI} wei, a `valid` on a forced "
                f"error {LAZY_VERDICT_PENALTY_WEI}); stake {needed - free} wei more on the "
                "market contract, or wait for your verdicts' rulings, then file again")
