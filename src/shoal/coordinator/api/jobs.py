"""A submitter's routes on its jobs: submit, top up, pause, resume, cancel (the owner
or an operator); anyone reads a job or the list of them (a page at a time)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shoal.coordinator.api.deps import (
    AfterLabel, Co, LabelPath, OwnerSigner, PageLimit, SubmitterSigner,
)
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.coordinator import DEFAULT_PAGE, JobStatus, JobSubmission, JobView, TopUp

router = APIRouter(tags=["jobs"], responses=PROBLEMS)


@router.post("/v1/jobs", status_code=201)
def submit(body: JobSubmission, co: Co, signer: SubmitterSigner) -> JobView:
    return co.jobs.submit(signer.address, body)


@router.get("/v1/jobs")
def jobs(co: Co, submitter: Annotated[str | None, Query(max_length=42)] = None,
         after: AfterLabel = None, limit: PageLimit = DEFAULT_PAGE) -> list[JobView]:
    """Jobs in the order they were submitted, a page at a time: pass the page's last
    job_id as `after` for the next one (a page shorter than `limit` is the last)."""
    return co.reads.jobs(submitter, after, limit)


@router.get("/v1/jobs/{job_id}")
def job(job_id: LabelPath, co: Co) -> JobView:
    return co.reads.job(job_id)


@router.post("/v1/jobs/{job_id}/top-up")
def top_up(job_id: LabelPath, body: TopUp, co: Co, signer: SubmitterSigner) -> JobView:
    return co.jobs.top_up(signer.address, job_id, body.amount_wei)


@router.post("/v1/jobs/{job_id}/pause")
def pause(job_id: LabelPath, co: Co, signer: OwnerSigner) -> JobView:
    return co.jobs.set_paused(signer.address, job_id, True)


@router.post("/v1/jobs/{job_id}/resume")
def resume(job_id: LabelPath, co: Co, signer: OwnerSigner) -> JobView:
    return co.jobs.set_paused(signer.address, job_id, False)


@router.post("/v1/jobs/{job_id}/cancel")
def cancel(job_id: LabelPath, co: Co, signer: OwnerSigner) -> JobView:
    return co.jobs.end(signer.address, job_id, JobStatus.cancelled)
