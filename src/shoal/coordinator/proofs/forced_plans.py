"""Each job's plan of forced errors: a secret committed to in an event before any of
the job's epochs is served or anchored (plants.py), and the anchor it seals. Both the
epochs' rooting (records.py) and the plants read the plan; whichever comes first makes
it."""

from __future__ import annotations

import os

from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import ForcedPlanRow
from shoal.coordinator.db.store import record_event
from shoal.proof.forced import ForcedErrors, sealed_root
from shoal.spec.coordinator import COORDINATOR
from shoal.spec.events import ForcedErrorsCommitted


def new_secret() -> bytes:
    return os.urandom(32)


def forced_plan(session: Session, job_id: str, rate: float, now: float) -> ForcedPlanRow:
    """The job's plan, made (and its commitment put on record) on the first call."""
    plan = session.get(ForcedPlanRow, job_id)
    if plan is None:
        forced = ForcedErrors(new_secret(), rate)
        plan = ForcedPlanRow(job_id=job_id, secret=forced.reveal().hex(),
                             commitment=forced.commitment(), rate=forced.rate,
                             committed_at_s=now)
        session.add(plan)
        record_event(session, now, COORDINATOR, ForcedErrorsCommitted(
            commitment=plan.commitment, rate=plan.rate), job_id)
    return plan


def anchored_value(session: Session, job_id: str, epoch: int, root: str, rate: float,
                   now: float) -> str:
    """What a rooted epoch anchors on chain: its root itself; sealed while forced errors
    are served (`rate` > 0), so that the chain does not tell verifiers which epochs'
    served roots differ from their records' (`shoal.proof.forced.sealed_root`)."""
    if rate <= 0:
        return root
    plan = forced_plan(session, job_id, rate, now)  # the secret is committed first
    salt = ForcedErrors(bytes.fromhex(plan.secret), plan.rate).anchor_salt(job_id, epoch)
    return "0x" + sealed_root(bytes.fromhex(root[2:]), salt).hex()
