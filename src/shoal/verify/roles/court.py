"""The referee's court: disputes decided by one re-executed step, and the
money moved through the contract (a cheat's lease slashed and unpaid, a
false accuser's bond kept, a lazy verifier's bond taken).

The referee's own audit is the same `Auditor` every verifier runs; what
makes it the last word is that it re-executes only the one step a
bisection leaves, so its cost does not grow with the epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount

from shoal.verify.roles.dispute import DisputeResult, bisect_dispute
from shoal.ledger import Ledger
from shoal.spec.proof import Verdict, WorkRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ruling:
    dispute: int  # the dispute's id on chain
    result: DisputeResult


class Court:
    def __init__(self, ledger: Ledger, referee: LocalAccount, job: int,
                 providers: dict[str, str], judge: Callable[[WorkRecord], Verdict]) -> None:
        """`providers`: worker -> the provider address its lease is under;
        `judge`: the referee's single-step audit of a record."""
        self.ledger, self.referee, self.job = ledger, referee, job
        self.providers, self.judge = providers, judge

    def dispute(self, challenger: LocalAccount, bond_wei: int, root: bytes,
                records: list[WorkRecord], accepts: Callable[[WorkRecord], bool]) -> Ruling:
        """`challenger` accuses the worker of `records` (one epoch); bisection, one replay
        by the referee, and the contract settles it."""
        worker = records[0].worker
        opened = self.ledger.open_dispute(challenger, self.job, self.providers[worker], bond_wei)
        result = bisect_dispute(root, records, accepts, self.judge)
        self.ledger.resolve_dispute(self.referee, opened.returned, upheld=result.upheld)
        log.warning("dispute %d on %s: step %s after %d rounds, %s", opened.returned, worker,
                    result.step, result.rounds, "upheld (slashed)" if result.upheld else "rejected")
        return Ruling(opened.returned, result)

    def penalize_verifier(self, verifier: str, amount_wei: int, whistleblower: str) -> None:
        """A verifier's signed verdict was shown wrong (a missed plant, a false accusation)."""
        self.ledger.slash_verifier(self.referee, verifier, amount_wei, whistleblower)
        log.warning("verifier %s slashed %d wei (shown by %s)", verifier, amount_wei, whistleblower)
