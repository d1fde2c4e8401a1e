"""The whistleblower: re-checks a verifier's signed verdicts by auditing the
same records itself, and names every verdict its own audit contradicts (a
lazy `valid` on a cheat, a false accusation of an honest worker)."""

from __future__ import annotations

from collections import defaultdict

from shoal.verify.roles.verdicts import SignedVerdict
from shoal.verify.roles.verifier import Verifier
from shoal.proof.epochs import epoch_of, final_lineage
from shoal.proof.merkle import epoch_tree
from shoal.proof.verdicts import Disagreement, disagreements
from shoal.spec.proof import WorkRecord
from shoal.verify.audit.record import Inclusion


def recheck(signed: list[SignedVerdict], verifier: Verifier,
            records: list[WorkRecord]) -> list[Disagreement]:
    """Re-audit the records behind authentic verdicts; the ones that disagree."""
    epoch_steps = verifier.spec.epoch_steps
    by_epoch: dict[int, list[WorkRecord]] = defaultdict(list)
    for record in records:
        by_epoch[epoch_of(record.step, epoch_steps)].append(record)
    trees = {e: epoch_tree(rs) for e, rs in by_epoch.items()}
    verdicts = [s.verdict for s in signed if s.authentic]
    rechecks = []
    for verdict in verdicts:
        tree, ordered = trees[verdict.epoch]
        index = next((i for i, r in enumerate(ordered)
                      if (r.step, r.worker) == (verdict.step, verdict.worker)), None)
        if index is None:
            continue
        root = verifier.roots(verdict.epoch) or tree.root
        step_records = [r for r in final_lineage(ordered) if r.step == verdict.step]
        rechecks.append(verifier.auditor.audit(
            ordered[index], Inclusion(verdict.epoch, index, tree.count, tree.proof(index), root),
            step_records))
    return disagreements(verdicts, rechecks)
