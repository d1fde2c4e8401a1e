"""The challenge window of a proof epoch: the coordinator's, not the workers'.

A verifier may ask for an epoch's files (a revealed contribution, a kept state, a
step's parameters) from the moment the epoch is served to verifiers until the job's
`[proof] keep_s` seconds later, and not after. Agents run their workers with
`prune = false` and drop an epoch's files only once they have seen its window closed
for a few beats (agent/proofs.py), so an honest worker answers every challenge the
coordinator took. Under DiLoCo a step's files are read by its round's end's audit as
well, so they live in the window of the epoch the round ends in
(`shoal.proof.epochs.window_epoch`; the agent prunes by the same rule, `kept_from`).

Why the window cannot be the workers' own: a worker drops its files on its own clock,
and the referee upholds `withheld` against an agent that was alive and did not answer.
A verifier that waited out the worker's window could then challenge an honest worker
and have its silence slashed. Nor can the window follow the job's progress as the
leases report it: a cheat could close its own window early with a record of a step far
ahead, and colluding leases could hold an honest worker's open. Here it opens when the
coordinator serves the epoch and lasts a span the submitter fixed in the job file;
no worker or verifier moves either end.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import ProofEpochRow, ServedEpochRow


def served_at(session: Session, job_id: str, forced_errors: bool) -> dict[int, float]:
    """When each of the job's epochs was served to verifiers: rooted, or with forced
    errors on, published with its plants (an epoch not served yet is not here)."""
    if forced_errors:
        return dict(session.execute(select(ServedEpochRow.epoch, ServedEpochRow.published_at_s)
                                    .where(ServedEpochRow.job_id == job_id,
                                           ServedEpochRow.published_at_s.is_not(None))).all())
    return dict(session.execute(select(ProofEpochRow.epoch, ProofEpochRow.rooted_at_s)
                                .where(ProofEpochRow.job_id == job_id)).all())


def closes_at(session: Session, job_id: str, epoch: int, keep_s: float,
              forced_errors: bool) -> float | None:
    """When the epoch's window closes; None while the epoch is not served (open)."""
    if forced_errors:
        at = session.scalar(select(ServedEpochRow.published_at_s).where(
            ServedEpochRow.job_id == job_id, ServedEpochRow.epoch == epoch))
    else:
        at = session.scalar(select(ProofEpochRow.rooted_at_s).where(
            ProofEpochRow.job_id == job_id, ProofEpochRow.epoch == epoch))
    return None if at is None else at + keep_s
