"""Which files an audit of chosen records needs from the workers' agents, as the
challenges that ask for them: what a verifier fetches before it replays, and what
the referee fetches before it re-executes the one step a dispute's bisection left.

Every-step: each record's revealed contribution, and the parameters its step
started from. Under DiLoCo also the worker's own kept states: where its step
started and where its next one did (a last-bit difference in where the step
ended is measured against it, or, where it did not go on from there, against
the kept starts of peers that did), and the files of every earlier step of the
worker's round (an audit re-takes the round up to its step, and a round's end
vouches for the whole round); the parameters are those of the round's start
(theta_outer).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from shoal.proof.epochs import final_lineage, params_keepers
from shoal.spec.audit import BlobKind, ChallengeRequest
from shoal.spec.proof import WorkRecord
from shoal.verify.audit.step_end import next_kept_starts


def record_files(chosen: Iterable[WorkRecord], records: list[WorkRecord]
                 ) -> tuple[list[ChallengeRequest], set[int]]:
    """The chosen records' own files, and the steps whose parameters their audits start
    from. `records`: those the audits may look back and ahead on (under DiLoCo, every
    rooted epoch's)."""
    wanted, starts = [], set()
    held = {(r.worker, r.step) for r in records}
    # Records by the optimizer state they start from, built once: a remote verifier holds
    # the whole job's records, and only those starting from a step's claimed end state
    # can be where its claim is measured (`next_kept_starts` picks among them).
    starting: dict[str, list[WorkRecord]] = defaultdict(list)
    for q in records:
        if q.local is not None:
            starting[q.local.state_sha256].append(q)
    for r in chosen:
        wanted.append(ChallengeRequest(worker=r.worker, step=r.step, kind=BlobKind.reveal))
        if r.local is None:
            starts.add(r.step)
            continue
        starts.add(r.local.round_start)
        first = r.local.round_start  # any step's audit re-takes its round up to it
        wanted += [ChallengeRequest(worker=r.worker, step=step, kind=kind)
                   for step in range(first, r.step) if (r.worker, step) in held
                   for kind in (BlobKind.local, BlobKind.reveal)]
        wanted += [ChallengeRequest(worker=r.worker, step=step, kind=BlobKind.local)
                   for step in (r.step, r.step + 1) if (r.worker, step) in held]
        # Where the worker did not go on from a step's claimed end itself, the kept
        # starts of the peers that did (the audit measures the claim against them).
        for own in (q for q in records if q.worker == r.worker and first <= q.step <= r.step):
            later = next_kept_starts(own, starting[own.local.end_state_sha256])
            if later and later[0].worker != r.worker:
                wanted += [ChallengeRequest(worker=q.worker, step=q.step, kind=BlobKind.local)
                           for q in later]
    return wanted, starts


def params_requests(starts: Iterable[int], records: list[WorkRecord]) -> list[ChallengeRequest]:
    """The challenges for the parameters of `starts`, each naming one of the step's
    keepers (`params_keepers`). Only the final lineage's keepers hold them: a record of
    a lineage that did not go on (a redone step's, or a decoy its worker filed under
    another epoch) names a keeper of other parameters, or one that will not answer.
    Where no keeper filed a record the request names another of the step's workers, and
    the coordinator asks the agent of a keeper's seat (it names the holder itself)."""
    lineage: dict[int, list[WorkRecord]] = defaultdict(list)
    for r in final_lineage(records):
        lineage[r.step].append(r)
    keepers = {step: r for step, here in lineage.items() for r in here
               if r.rank in params_keepers(step, len(r.shares))}
    return [ChallengeRequest(worker=keepers[step].worker if step in keepers
                             else lineage[step][0].worker, step=step, kind=BlobKind.params)
            for step in sorted(starts) if step in lineage]
