"""Reading verdicts: who is guilty, and where a whistleblower's re-check
disagrees with a verifier (a lazy verifier misses, a malicious one accuses)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shoal.spec.proof import Verdict, VerdictKind


@dataclass(frozen=True)
class WorkerSummary:
    worker: str
    audited: int  # verdicts that reached a conclusion on the worker
    guilty_verdicts: tuple[Verdict, ...]
    unavailable: int  # audits that could not be run: no conclusion, no blame

    @property
    def guilty(self) -> bool:
        # One proven cheat is enough: a cheat is not averaged away by honest steps.
        return bool(self.guilty_verdicts)


def summarise(verdicts: Iterable[Verdict]) -> dict[str, WorkerSummary]:
    """Per worker: how many audits concluded, and which found it guilty."""
    concluded: dict[str, list[Verdict]] = {}
    unavailable: dict[str, int] = {}
    for v in verdicts:
        if v.kind is VerdictKind.unavailable:
            unavailable[v.worker] = unavailable.get(v.worker, 0) + 1
            concluded.setdefault(v.worker, [])
        else:
            concluded.setdefault(v.worker, []).append(v)
    return {w: WorkerSummary(w, len(vs), tuple(v for v in vs if v.guilty), unavailable.get(w, 0))
            for w, vs in sorted(concluded.items())}


def guilty_workers(verdicts: Iterable[Verdict]) -> frozenset[str]:
    return frozenset(w for w, s in summarise(verdicts).items() if s.guilty)


@dataclass(frozen=True)
class Disagreement:
    """A verdict the re-check contradicts."""

    verdict: Verdict  # the verifier's
    recheck: Verdict  # the whistleblower's, on the same record

    @property
    def missed(self) -> bool:
        """The verifier called a cheat valid (lazy); otherwise it accused an honest worker."""
        return not self.verdict.guilty


def _item(v: Verdict) -> tuple[str, int, int, str]:
    return (v.job, v.epoch, v.step, v.worker)


def disagreements(verdicts: Iterable[Verdict], rechecks: Iterable[Verdict]) -> list[Disagreement]:
    """The verifier's verdicts that a re-check of the same record contradicts.

    Only guilt is compared (two guilty kinds agree that the worker cheated),
    and an `unavailable` on either side contradicts nothing.
    """
    checked = {_item(r): r for r in rechecks if r.kind is not VerdictKind.unavailable}
    found = []
    for v in verdicts:
        recheck = checked.get(_item(v))
        if v.kind is not VerdictKind.unavailable and recheck and recheck.guilty != v.guilty:
            found.append(Disagreement(v, recheck))
    return found
