"""A verifier that audits a running job through its coordinator.

For each proof epoch the coordinator has rooted: fetch the epoch's records,
choose the records to audit with the verifier's own salted beacon over the
root (so no worker knows in advance which of its steps will be replayed,
and the coordinator learns the choice only as it is made), challenge their
revealed contributions and the steps' start parameters, wait for the
agents to answer, replay, and file the signed verdicts. An unanswered
reveal is a `withheld` verdict; unanswered parameters leave the record
`unavailable` (no verdict on the worker).

Under DiLoCo a record's audit also needs the state the worker's own step
started from (and, to measure a last-bit difference, its next one), the
parameters of its round's start rather than of its step, and the worker's
records back to that start, which may lie in earlier epochs. A round whose
end its worker filed no record of is replayed from the states the worker
kept for each of its steps (and its earlier record-less rounds'), which are
challenged from the agent of the worker's lease.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from eth_account.signers.local import LocalAccount

from shoal.client.http import CoordinatorClient, CoordinatorRefused
from shoal.errors import ControlError
from shoal.verify.roles.needed import params_requests, record_files
from shoal.verify.roles.verdicts import sign_verdict
from shoal.verify.roles.verifier import EpochAudit, Verifier
from shoal.proof.epochs import final_lineage
from shoal.proof.merkle import epoch_tree
from shoal.spec.audit import (
    MAX_CHALLENGES_PER_REQUEST, MAX_VERDICTS_PER_FILING, BlobKind, ChallengeRequest,
    ChallengeView, SignedVerdictBody, VerdictFiling,
)
from shoal.spec.job import JobSpec
from shoal.spec.proof import Verdict, VerdictKind, WorkRecord
from shoal.verify.audit.record import Auditor
from shoal.verify.audit.unrecorded import Unrecorded
from shoal.verify.audit.unrecorded_round import record_less_rounds
from shoal.verify.proof_store import ProofStore

log = logging.getLogger(__name__)
FILING_ATTEMPTS = 3  # a filing refused for a file answered meanwhile is audited again


class RemoteAudits:
    def __init__(self, client: CoordinatorClient, job_id: str, job: JobSpec, auditor: Auditor,
                 account: LocalAccount, *, salt: bytes, rate: float | None = None,
                 every: bool = False, answer_wait_s: float = 60.0, poll_s: float = 0.5,
                 recheck: bool = False) -> None:
        """`recheck`: a whistleblower, re-auditing the records other verifiers judged (a
        `valid` it finds wrong is upheld against the cheat and the verifier that signed it)."""
        self.client, self.job_id, self.job, self.account = client, job_id, job, account
        self.recheck = recheck
        self._judged: dict[int, set[tuple[str, int]]] = {}
        self.store: ProofStore = auditor.store
        self.rate, self.every = rate, every
        self.answer_wait_s, self.poll_s = answer_wait_s, poll_s
        self.roots: dict[int, bytes] = {}
        self._members: dict[int, tuple[str, ...]] = {}  # the job's published membership
        self._sources: dict[int, str] = {}  # ... and the state source each epoch named
        self.verifier = Verifier(auditor, job.proof, salt=salt, roots=self.roots.get,
                                 total_steps=job.steps, members=self._members.get,
                                 sources=self._sources.get)
        self.done: set[int] = set()
        self._records: dict[int, list[WorkRecord]] = {}  # served epochs' (they stay as served)
        self._around: list[WorkRecord] = []  # what the audits being replayed may look back on
        self._too_late: set[str] = set()  # workers whose files were asked for past the window
        auditor.local.records = lambda: self._around

    def pending_epochs(self) -> list[int]:
        epochs = self.client.proof_epochs(self.job_id)
        self.roots.update({e.epoch: bytes.fromhex(e.root[2:]) for e in epochs})
        if self.recheck:
            self._judged = {}
            for view in self.client.verdicts(self.job_id):
                v = view.verdict
                if v.verifier.lower() != self.account.address.lower():
                    self._judged.setdefault(v.epoch, set()).add((v.worker, v.step))
            return [e.epoch for e in epochs if e.epoch not in self.done and e.epoch in self._judged]
        for e in epochs:
            if e.epoch not in self.done and not e.challenges_open:
                # Too late to ask for its files, so too late to audit it: not judged (a
                # `withheld` on a file nobody could ask for would be a false accusation).
                log.warning("job %s: proof epoch %d's challenge window closed before this "
                            "verifier reached it; not audited", self.job_id, e.epoch)
                self.done.add(e.epoch)
        return [e.epoch for e in epochs if e.epoch not in self.done]

    def audit(self, epoch: int, on_audit: Callable[[EpochAudit], None] = lambda _: None) -> EpochAudit:
        records = self.client.work_records(self.job_id, epoch)
        _, ordered = epoch_tree(records)
        if self.recheck:
            judged = self._judged.get(epoch, set())
            chosen = [r for r in final_lineage(ordered) if (r.worker, r.step) in judged]
        else:
            chosen = self.verifier.chosen(epoch, ordered, self.roots[epoch], rate=self.rate,
                                          every=self.every)
        result = self.replay(epoch, records, chosen)
        filed: list[Verdict] = []
        unfiled = result.verdicts
        for _ in range(FILING_ATTEMPTS):
            unfiled = self._answered_since(epoch, records, chosen, unfiled)
            left = self._file(unfiled)
            filed += unfiled[: len(unfiled) - len(left)]
            unfiled = left
            if not unfiled:
                break
        else:
            raise ControlError(f"job {self.job_id} epoch {epoch}: the coordinator refused "
                               f"{len(unfiled)} verdict(s) {FILING_ATTEMPTS} times, each for a "
                               "file answered meanwhile; run `shoal verify` again")
        result.verdicts = filed
        self.done.add(epoch)
        on_audit(result)
        return result

    def replay(self, epoch: int, records: list[WorkRecord], chosen: list[WorkRecord], *,
               unrecorded: bool = True) -> EpochAudit:
        """Fetch what the `chosen` records' audits need and replay them, and (with
        `unrecorded`) every share of the epoch's steps filed without a record (a
        whistleblower: those others judged); files nothing."""
        judged = self._judged.get(epoch, set()) if self.recheck else None
        shares = []
        if not unrecorded:
            judged = set()  # none judged
        else:
            changes = self.client.membership(self.job_id)
            self._members.update({c.epoch: c.members for c in changes})
            self._sources.update({c.epoch: c.state_source for c in changes if c.state_source})
            shares = [u for u in self.verifier.unrecorded(records) if u.worker is not None
                      and (judged is None or (u.worker, u.step) in judged)]
        # Under DiLoCo the files an audit needs may be named by records of other epochs
        # (the round's start, the worker's next step), and the audit follows a worker's
        # chain of steps back to its round's start. A claimed round end is measured where
        # a later record starts from it, which may be any later epoch's (a peer restarting
        # at theta_outer from an old round's end): so every rooted epoch's records, each
        # fetched once.
        # An every-step audit looks back one step before the epoch's first: the chain
        # from the previous epoch's last step (its break falls on the state source of an
        # epoch formed right at the boundary).
        diloco = any(r.local is not None for r in records)
        self._around = self._served_records(max(self.roots, default=epoch)) if diloco \
            else self._epoch_records(epoch - 1) + records
        self._too_late = set()
        self._fetch(chosen, self._around, shares)
        result = self.verifier.audit_epoch(epoch, records, chosen=chosen, judged=judged)
        result.verdicts = [_not_asked(v) if v.kind is VerdictKind.withheld
                           and v.worker in self._too_late else v for v in result.verdicts]
        return result

    def _answered_since(self, epoch: int, records: list[WorkRecord], chosen: list[WorkRecord],
                        verdicts: list[Verdict]) -> list[Verdict]:
        """`verdicts`, with each `withheld` or `unavailable` one whose files were answered
        after the wait ended audited again on them: an agent that answers late withheld
        nothing (filing `withheld` over its answer would be a false accusation), and a
        step's parameters that came late make it auditable after all."""
        waiting = (VerdictKind.withheld, VerdictKind.unavailable)
        redo_keys = {(v.worker, v.step) for v in verdicts if v.kind in waiting}
        if not redo_keys:
            return verdicts
        workers = {w for w, _ in redo_keys}
        first, last = min(s for _, s in redo_keys), max(s for _, s in redo_keys)
        # A worker's own files up to the step (under DiLoCo a round's end reads its
        # round's), and the parameters a step (or its round) started from.
        reach = max(1, self.job.sync.inner_steps)
        fresh = [c for c in self.client.challenges(self.job_id)
                 if c.answered_at_s is not None and c.step <= last and not self._saved(c)
                 and (c.worker in workers if c.kind is not BlobKind.params
                      else c.step > first - reach)]
        if not fresh:
            return verdicts
        for view in fresh:
            self._save(view)
        self.verifier.auditor.forget_loaded()
        redo = [r for r in chosen if (r.worker, r.step) in redo_keys]
        shares = {key for key in redo_keys if not any((r.worker, r.step) == key for r in redo)}
        again = self.verifier.audit_epoch(epoch, records, chosen=redo, judged=shares)
        renewed = {(v.worker, v.step): _not_asked(v) if v.kind is VerdictKind.withheld
                   and v.worker in self._too_late else v for v in again.verdicts}
        return [renewed.get((v.worker, v.step), v) if v.kind in waiting else v
                for v in verdicts]

    def _served_records(self, upto: int) -> list[WorkRecord]:
        """The records of every epoch up to `upto` that the coordinator serves (rooted)."""
        out = []
        for epoch in sorted(e for e in self.roots if e <= upto):
            out += self._epoch_records(epoch)
        return out

    def _epoch_records(self, epoch: int) -> list[WorkRecord]:
        """One rooted epoch's records, fetched once; none for an epoch not rooted."""
        if epoch not in self.roots:
            return []
        if epoch not in self._records:
            self._records[epoch] = self.client.work_records(self.job_id, epoch)
        return self._records[epoch]

    def _fetch(self, chosen: list[WorkRecord], records: list[WorkRecord],
               unrecorded: list[Unrecorded] = ()) -> None:
        """Challenge what the chosen audits need, and the `unrecorded` shares' (a step's
        parameters; under DiLoCo, the worker's kept states of its record-less rounds and
        the parameters each began from), and bring the answers into the local store."""
        wanted, starts = record_files(chosen, records)
        # A step's parameters are kept by two of its workers (`params_keepers`); the
        # coordinator asks one whose agent is online. Without a keeper's record (both lost
        # before they sent it) nobody holds them, and the audit says `unavailable`. A
        # DiLoCo step's are those of its round's start (theta_outer).
        lineage: dict[int, list[WorkRecord]] = defaultdict(list)
        for r in final_lineage(records):
            lineage[r.step].append(r)
        for share in unrecorded:
            if not any(r.local is not None for r in lineage.get(share.step, [])):
                starts.add(share.step)  # every-step: replayed from the step's parameters
                continue
            for span in record_less_rounds(share.worker, share.step, lineage):
                starts.add(span.start)
                wanted += [ChallengeRequest(worker=share.worker, step=step, kind=BlobKind.local)
                           for step in span
                           if not self.store.layout.local(share.worker, step).exists()]
        wanted += params_requests(starts, records)
        views: dict[int, ChallengeView] = {}
        for i in range(0, len(wanted), MAX_CHALLENGES_PER_REQUEST):
            batch = wanted[i : i + MAX_CHALLENGES_PER_REQUEST]
            try:
                found = self.client.raise_challenges(self.job_id, batch)
            except CoordinatorRefused as refused:
                if refused.status not in (404, 410):
                    raise
                found = self._one_by_one(batch)
            views.update({view.challenge: view for view in found})
        deadline = time.monotonic() + self.answer_wait_s
        while True:
            for view in list(views.values()):
                if view.answered_at_s is not None:
                    self._save(view)
                    views.pop(view.challenge)
                elif view.holder_offline:
                    log.warning("challenge %d (%s of %s, step %d): its agent is offline",
                                view.challenge, view.kind.value, view.worker, view.step)
                    views.pop(view.challenge)
            if not views or time.monotonic() > deadline:
                break
            time.sleep(self.poll_s)
            latest = {v.challenge: v for v in self.client.challenges(self.job_id)}
            views = {n: latest.get(n, v) for n, v in views.items()}
        for view in views.values():
            log.warning("challenge %d (%s of %s, step %d) unanswered after %.0f s", view.challenge,
                        view.kind.value, view.worker, view.step, self.answer_wait_s)

    def _one_by_one(self, batch: list[ChallengeRequest]) -> list[ChallengeView]:
        found = []
        for item in batch:
            try:
                found += self.client.raise_challenges(self.job_id, [item])
            except CoordinatorRefused as refused:
                if refused.status not in (404, 410):
                    raise
                if refused.status == 410:
                    self._too_late.add(item.worker)
                log.warning("cannot challenge %s of %s at step %d: %s", item.kind.value,
                            item.worker, item.step, refused.detail)
        return found

    def _path(self, view: ChallengeView) -> Path:
        return self.store.layout.kept(view.kind, view.worker, view.step)

    def _saved(self, view: ChallengeView) -> bool:
        return self._path(view).exists()

    def _save(self, view: ChallengeView) -> None:
        path = self._path(view)
        if path.exists():
            return
        data = self.client.challenge_file(view.challenge)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(str(path) + ".part")
        partial.write_bytes(data)
        partial.replace(path)

    def _file(self, verdicts: list[Verdict]) -> list[Verdict]:
        """File `verdicts`, a batch at a time; those left unfiled when the coordinator
        refuses a batch for a `withheld` whose file came in between the re-check and the
        filing (409: the batch changed nothing), else []."""
        for i in range(0, len(verdicts), MAX_VERDICTS_PER_FILING):
            batch = [sign_verdict(v, self.account) for v in verdicts[i : i + MAX_VERDICTS_PER_FILING]]
            try:
                self.client.file_verdicts(self.job_id, VerdictFiling(verdicts=tuple(
                    SignedVerdictBody(verdict=s.verdict, signature=s.signature) for s in batch)))
            except CoordinatorRefused as refused:
                if refused.status != 409:
                    raise
                log.info("job %s: %s; auditing again", self.job_id, refused.detail)
                return verdicts[i:]
        return []


def _not_asked(verdict: Verdict) -> Verdict:
    """A worker's file that was missing because the window closed before this verifier
    asked is not the worker's fault: the audit could not be done."""
    return verdict.model_copy(update={
        "kind": VerdictKind.unavailable,
        "detail": "its files were asked for after the epoch's challenge window closed"})
