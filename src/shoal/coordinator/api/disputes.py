"""Disputes brought from the contract: whoever opened one there (its bond on chain is
its standing) files it here, and anyone reads a job's disputes and their rulings."""

from __future__ import annotations

from fastapi import APIRouter

from shoal.coordinator.api.deps import AnySigner, Co, LabelPath
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.audit import DisputeFiling, DisputeView

router = APIRouter(tags=["proof"], responses=PROBLEMS)


@router.post("/v1/jobs/{job_id}/proof/disputes", status_code=201)
def file_dispute(job_id: LabelPath, body: DisputeFiling, co: Co,
                 signer: AnySigner) -> DisputeView:
    return co.disputes.file_dispute(signer.address, job_id, body)


@router.get("/v1/jobs/{job_id}/proof/disputes")
def disputes(job_id: LabelPath, co: Co) -> list[DisputeView]:
    co.reads.job(job_id)
    return co.disputes.of_job(job_id)
