"""The verifier: for each complete proof epoch of a job, take its anchored
root (or build it from the records when nothing is anchored), pick records
to audit with a beacon nobody controls before the root is fixed, replay
them, and sign what it finds.

Which records are audited is fixed by the root and the verifier's salt, so
a worker cannot know in advance which of its steps will be replayed, and
anyone with the salt can check the verifier audited what it had to.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from shoal.proof.chain import ChainBreak, StateSources, chain_breaks
from shoal.proof.epochs import by_epoch, epoch_of, final_lineage, is_complete, steps_of
from shoal.proof.merkle import MerkleTree, epoch_tree
from shoal.proof.sampling import audit_sample, beacon
from shoal.spec.proof import ProofSpec, Verdict, VerdictKind, WorkRecord
from shoal.verify.audit.record import Auditor, Inclusion
from shoal.verify.audit.unrecorded import Members, Unrecorded, unrecorded_shares

log = logging.getLogger(__name__)

# epoch -> its anchored root, or None when not anchored (yet).
RootSource = Callable[[int], bytes | None]


@dataclass
class EpochAudit:
    epoch: int
    root: bytes
    anchored: bool  # the root came from the chain (else it was built from the records)
    records: int
    verdicts: list[Verdict] = field(default_factory=list)
    replay_s: float = 0.0  # seconds spent auditing (the verifier's cost)
    # Shares of voted steps with no record whose worker the verifier could not name (it
    # was not given the job's published membership): not judged.
    unnamed: list[Unrecorded] = field(default_factory=list)
    # Steps that do not start where the step before ended (`shoal.proof.chain`); each one
    # with a state source to blame is also a guilty verdict on it.
    breaks: list[ChainBreak] = field(default_factory=list)

    @property
    def guilty(self) -> dict[str, list[Verdict]]:
        out: dict[str, list[Verdict]] = defaultdict(list)
        for verdict in self.verdicts:
            if verdict.guilty:
                out[verdict.worker].append(verdict)
        return dict(out)


class Verifier:
    def __init__(self, auditor: Auditor, spec: ProofSpec, *, salt: bytes,
                 roots: RootSource = lambda epoch: None, total_steps: int | None = None,
                 leaves: Callable[[int], list[bytes] | None] = lambda epoch: None,
                 members: Members = lambda epoch: None,
                 sources: StateSources = lambda epoch: None) -> None:
        """`roots`: each epoch's anchored root; `leaves`: the leaves the operator
        published with it (both None when not anchored); `members`: the job's published
        membership epochs, each its members in rank order (names the workers of shares
        filed without a record); `sources`: the state source each published epoch named
        (a break in the chain of steps falls on it)."""
        self.auditor, self.spec, self.salt = auditor, spec, salt
        self.roots, self.total_steps, self.leaves = roots, total_steps, leaves
        self.members, self.sources = members, sources

    def complete_epochs(self, records: list[WorkRecord]) -> list[int]:
        grouped = by_epoch(records, self.spec.epoch_steps)
        return [e for e in sorted(grouped)
                if is_complete(grouped[e], e, self.spec.epoch_steps, self.total_steps)]

    def chosen(self, epoch: int, ordered: list[WorkRecord], root: bytes, *,
               rate: float | None = None, every: bool = False) -> list[WorkRecord]:
        """The records of an epoch this verifier must audit (fixed by root and salt)."""
        current = final_lineage(ordered)  # an abandoned lineage's records are not audited
        if every:
            return current
        return audit_sample(current, rate or self.spec.audit_rate,
                            self.spec.min_audits_per_worker, beacon(root, self.salt))

    def unrecorded(self, records: list[WorkRecord]) -> list[Unrecorded]:
        """The shares of voted steps whose workers filed no record in the final lineage.
        Every one is judged, not a sample: they are rare (a lost machine, or a cheat
        hiding a poisoned part), and a sample would let the cheat hide in the odds."""
        by_step: dict[int, list[WorkRecord]] = defaultdict(list)
        for record in final_lineage(records):
            by_step[record.step].append(record)
        return self._unrecorded(by_step)

    def _unrecorded(self, by_step: dict[int, list[WorkRecord]]) -> list[Unrecorded]:
        """`unrecorded`, from the final lineage's records grouped by step."""
        return [share for step in sorted(by_step)
                for share in unrecorded_shares(by_step[step], self.members)]

    def breaks(self, epoch: int, ordered: list[WorkRecord]) -> list[ChainBreak]:
        """The breaks in the chain of steps at `epoch`'s steps, along the final lineage of
        its records and the job's earlier ones (the step before its first, a snapshot's)."""
        first = steps_of(epoch, self.spec.epoch_steps).start
        earlier = [r for r in self.auditor.local.records() if r.step < first]
        return chain_breaks(final_lineage(earlier + ordered), self.sources,
                            steps_of(epoch, self.spec.epoch_steps))

    def _break_verdict(self, found: ChainBreak, epoch: int, job: str) -> Verdict:
        assert found.source is not None
        return Verdict(job=job, epoch=epoch, step=found.step, worker=found.source,
                       kind=VerdictKind.wrong_params, verifier=self.auditor.verifier,
                       detail=f"the chain of steps breaks: {found.detail}")

    def audit_one(self, record: WorkRecord, epoch_records: list[WorkRecord]) -> Verdict:
        """Audit one record against its epoch's tree (the referee's single re-execution)."""
        tree, ordered = epoch_tree(epoch_records)
        epoch = epoch_of(record.step, self.spec.epoch_steps)
        for found in self.breaks(epoch, ordered):
            if found.blames(record.worker, record.step):
                return self._break_verdict(found, epoch, record.job)
        root = self.roots(epoch) or tree.root
        i = next(i for i, r in enumerate(ordered) if (r.step, r.worker, r.membership_epoch)
                 == (record.step, record.worker, record.membership_epoch))
        return self.auditor.audit(ordered[i], Inclusion(epoch, i, tree.count, tree.proof(i), root),
                                  [r for r in final_lineage(ordered) if r.step == record.step])

    def audit_epoch(self, epoch: int, records: list[WorkRecord], *, rate: float | None = None,
                    every: bool = False, chosen: list[WorkRecord] | None = None,
                    judged: Collection[tuple[str, int]] | None = None) -> EpochAudit:
        """Audit one epoch's records: a sample at `rate` (the job's by default), all, or the
        `chosen` ones (a whistleblower re-checks what others judged); and every share
        filed without a record, or of those only the (worker, step)s `judged`."""
        tree, ordered = epoch_tree(records)
        anchored = self.roots(epoch)
        root = anchored if anchored is not None else tree.root
        published = self.leaves(epoch)
        if published is not None and MerkleTree(published).root == root and \
                len(published) == len(ordered):
            # Prove each record against the anchored leaves: a record changed since the
            # anchor fails alone, instead of breaking its neighbours' proofs.
            tree = MerkleTree(published)
        if chosen is None:
            chosen = self.chosen(epoch, ordered, root, rate=rate, every=every)
        by_step: dict[int, list[WorkRecord]] = defaultdict(list)
        for record in final_lineage(ordered):
            by_step[record.step].append(record)
        index = {(r.step, r.worker, r.membership_epoch): i for i, r in enumerate(ordered)}
        result = EpochAudit(epoch, root, anchored is not None, len(ordered))
        started = time.perf_counter()
        for record in sorted(chosen, key=lambda r: (r.step, r.worker)):
            i = index[(record.step, record.worker, record.membership_epoch)]
            inclusion = Inclusion(epoch, i, tree.count, tree.proof(i), root)
            result.verdicts.append(self.auditor.audit(record, inclusion, by_step[record.step]))
        for share in self._unrecorded(by_step) if judged is None or judged else ():
            if share.worker is None:
                result.unnamed.append(share)
            elif judged is None or (share.worker, share.step) in judged:
                result.verdicts.append(self.auditor.audit_unrecorded(
                    share, epoch, by_step[share.step], self.members))
        if result.unnamed:
            log.warning("epoch %d: %d share(s) of voted steps have no record and no known "
                        "worker (give the verifier the job's membership epochs to judge "
                        "them)", epoch, len(result.unnamed))
        self._judge_breaks(result, ordered, judged)
        result.replay_s = time.perf_counter() - started
        for worker, found in result.guilty.items():
            log.warning("epoch %d: %s failed %d audit(s): %s", epoch, worker, len(found),
                        found[0].kind.value)
        return result


    def _judge_breaks(self, result: EpochAudit, ordered: list[WorkRecord],
                      judged: Collection[tuple[str, int]] | None) -> None:
        """Every break in the epoch's chain, not a sample (a few hashes each): one with a
        state source to blame is a guilty verdict on it at the step, in place of any other
        verdict there; one without is reported."""
        if not ordered:
            return
        result.breaks = self.breaks(result.epoch, ordered)
        for found in result.breaks:
            if found.source is None:
                log.warning("epoch %d: the chain of steps breaks and no state source is "
                            "known to blame: %s", result.epoch, found.detail)
                continue
            if judged is not None and (found.source, found.step) not in judged:
                continue
            result.verdicts = [v for v in result.verdicts
                               if (v.worker, v.step) != (found.source, found.step)]
            result.verdicts.append(self._break_verdict(found, result.epoch, ordered[0].job))


# -- verifiers that cheat, to rehearse the checks on verifiers ------------------------


def lazy_verdicts(verifier: Verifier, epoch: int, records: list[WorkRecord], *,
                  every: bool = False) -> list[Verdict]:
    """A lazy verifier: signs `valid` on what it was to audit, without replaying."""
    tree, ordered = epoch_tree(records)
    root = verifier.roots(epoch) or tree.root
    return [Verdict(job=r.job, epoch=epoch, step=r.step, worker=r.worker, kind=VerdictKind.valid,
                    verifier=verifier.auditor.verifier, detail="not replayed")
            for r in verifier.chosen(epoch, ordered, root, every=every)]


def false_accusations(verdicts: list[Verdict], victim: str) -> list[Verdict]:
    """A malicious verifier: calls every audited record of `victim` wrong."""
    return [v.model_copy(update={"kind": VerdictKind.wrong_contribution, "detail": "accused"})
            if v.worker == victim else v for v in verdicts]
