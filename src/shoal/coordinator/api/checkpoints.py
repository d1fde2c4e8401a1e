"""The API's routes on carried checkpoints: the agent of a job's checkpoint
writer sends each new one; an agent whose worker joins fetches the newest;
the submitter may fetch its job's model. Who may send or read is decided in
`checkpoints.py`; the metadata (step, hash, who sent it) is public."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import FileResponse

from shoal.coordinator.api.deps import (
    FILE_BODY, FILE_REPLY, AnySigner, Co, LabelPath, ProviderSigner, RawBody, StepPath,
)
from shoal.coordinator.api.errors import PROBLEMS
from shoal.coordinator.errors import NotFound
from shoal.spec.checkpoint import CheckpointView

router = APIRouter(tags=["checkpoints"], responses=PROBLEMS)


@router.get("/v1/jobs/{job_id}/checkpoint")
def newest(job_id: LabelPath, co: Co) -> CheckpointView | None:
    return co.carry.carried(job_id)


@router.put("/v1/jobs/{job_id}/checkpoints/{step}", openapi_extra=FILE_BODY)
def upload(job_id: LabelPath, step: StepPath, co: Co, signer: ProviderSigner, data: RawBody,
           lease: Annotated[int, Query(ge=1, le=2**62)]) -> CheckpointView:
    return co.carry.upload_checkpoint(signer.address, job_id, lease, step, data)


@router.get("/v1/jobs/{job_id}/checkpoints/{step}/file", response_class=Response,
            responses=FILE_REPLY)
def download(job_id: LabelPath, step: StepPath, co: Co, signer: AnySigner) -> FileResponse:
    view, path = co.carry.checkpoint_file(signer.address, job_id)
    if view.step != step:
        raise NotFound(f"job '{job_id}' carries step {view.step}, not {step}; ask "
                       f"/v1/jobs/{job_id}/checkpoint for the newest")
    return FileResponse(path, media_type="application/octet-stream",
                        headers={"x-shoal-sha256": view.sha256})
