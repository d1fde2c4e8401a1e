"""Rows of the proof tables as the API shows them, and the one read of a job's verdicts
that the verdicts' desk and the penalties both make."""

from __future__ import annotations

from sqlalchemy import select

from shoal.coordinator.db.schema import (
    ChallengeRow, DisputeRow, PlantRow, ProofEpochRow, VerdictRow,
)
from shoal.coordinator.db.store import Store
from shoal.coordinator.services.numbering import FETCH_BASE
from shoal.spec.audit import BlobKind, ChallengeView, DisputeView, ProofEpochView, VerdictView
from shoal.spec.proof import Verdict


def challenge_view(row: ChallengeRow) -> ChallengeView:
    return ChallengeView(challenge=row.challenge, job_id=row.job_id, worker=row.worker,
                         step=row.step, kind=BlobKind(row.kind), agent_id=row.agent_id,
                         requested_at_s=row.requested_at_s, answered_at_s=row.answered_at_s,
                         sha256=row.sha256)


def fetch_view(row: PlantRow) -> ChallengeView:
    """A plant's fetch of its worker's real file, as the agent sees it: a challenge like
    any other (numbered from FETCH_BASE), so nothing tells the agent it is a plant's."""
    return ChallengeView(challenge=FETCH_BASE + row.plant, job_id=row.job_id, worker=row.worker,
                         step=row.step, kind=BlobKind.reveal, agent_id=row.agent_id,
                         requested_at_s=row.requested_at_s)


def verdict_view(row: VerdictRow) -> VerdictView:
    return VerdictView(seq=row.seq, at_s=row.at_s,
                       verdict=Verdict.model_validate(row.body["verdict"]), ruling=row.ruling)


def epoch_view(row: ProofEpochRow) -> ProofEpochView:
    return ProofEpochView(epoch=row.epoch, root=row.root, records=row.records,
                          complete=row.complete, chain_epoch=row.chain_epoch,
                          anchored_at_s=row.anchored_at_s, anchor_tx=row.anchor_tx,
                          anchored_root=row.anchored_root)


def dispute_view(row: DisputeRow) -> DisputeView:
    return DisputeView(dispute=row.dispute, job_id=row.job_id, worker=row.worker,
                       epoch=row.epoch, challenger=row.challenger, provider=row.provider,
                       filed_at_s=row.filed_at_s, step=row.step, rounds=row.rounds,
                       ruling=row.ruling, why=row.why or "", tx=row.tx,
                       chain_state=row.chain_state)


def job_verdicts(store: Store, job_id: str) -> list[VerdictView]:
    """The job's verdicts, in the order they were filed."""
    with store.read() as session:
        rows = session.scalars(select(VerdictRow).where(VerdictRow.job_id == job_id)
                               .order_by(VerdictRow.seq))
        return [verdict_view(row) for row in rows]
