"""A job's run as it goes: its workers' agents upload step progress; anyone reads
progress, membership changes, the planner's view of the members and the job file."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shoal.coordinator.api.deps import Co, LabelPath, ProviderSigner
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.audit import JobFile
from shoal.spec.progress import JobPlanView, MembershipChange, ProgressUpload, StepProgress

router = APIRouter(tags=["jobs"], responses=PROBLEMS)


@router.post("/v1/jobs/{job_id}/progress")
def upload_progress(job_id: LabelPath, body: ProgressUpload, co: Co,
                    signer: ProviderSigner) -> dict[str, int]:
    return {"stored": co.progress.record(signer.address, job_id, body)}


@router.get("/v1/jobs/{job_id}/progress")
def progress(job_id: LabelPath, co: Co,
             after: Annotated[int, Query(ge=-1, le=2**62)] = -1) -> list[StepProgress]:
    return co.progress.steps(job_id, after)


@router.get("/v1/jobs/{job_id}/membership")
def membership(job_id: LabelPath, co: Co) -> list[MembershipChange]:
    return co.progress.membership(job_id)


@router.get("/v1/jobs/{job_id}/plan")
def plan(job_id: LabelPath, co: Co) -> JobPlanView | None:
    return co.planning.job_plan(job_id)


@router.get("/v1/jobs/{job_id}/job-file")
def job_file(job_id: LabelPath, co: Co) -> JobFile:
    return JobFile(job_id=job_id, job_file=co.specs.job_file(job_id))
