"""The API's routes on carried checkpoints: the agent of a job's checkpoint
writer sends each new one; an agent whose worker joins fetches the newest;
the submitter may fetch its job's model. Who may send or read is decided in
`checkpoints.py`; the metadata (step, hash, who sent it) is public."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Response
from fastapi.responses import FileResponse

from shoal.coordinator.api.auth import coordinator_of, raw_body, signed
from shoal.coordinator.errors import NotFound
from shoal.coordinator.service import Coordinator
from shoal.client.identity import Signer
from shoal.spec.checkpoint import CheckpointView
from shoal.spec.coordinator import Role

JobPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
StepPath = Annotated[int, Path(ge=0, le=2**62)]
Co = Annotated[Coordinator, Depends(coordinator_of)]
ProviderSigner = Annotated[Signer, Depends(signed(Role.provider))]
AnySigner = Annotated[Signer, Depends(signed())]
# Checkpoint bodies are files (their path is in file_admission.FILE_UPLOADS).
FILE_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


def checkpoint_routes(app: FastAPI) -> None:
    @app.get("/v1/jobs/{job_id}/checkpoint", tags=["checkpoints"])
    def newest(job_id: JobPath, co: Co) -> CheckpointView | None:
        return co.carried(job_id)

    @app.put("/v1/jobs/{job_id}/checkpoints/{step}", tags=["checkpoints"],
             openapi_extra=FILE_BODY)
    def upload(job_id: JobPath, step: StepPath, co: Co, signer: ProviderSigner,
               data: Annotated[bytes, Depends(raw_body)],
               lease: Annotated[int, Query(ge=1, le=2**62)]) -> CheckpointView:
        return co.upload_checkpoint(signer.address, job_id, lease, step, data)

    @app.get("/v1/jobs/{job_id}/checkpoints/{step}/file", tags=["checkpoints"],
             response_class=Response, responses={200: {"content": {"application/octet-stream": {}}}})
    def download(job_id: JobPath, step: StepPath, co: Co, signer: AnySigner) -> FileResponse:
        view, path = co.checkpoint_file(signer.address, job_id)
        if view.step != step:
            raise NotFound(f"job '{job_id}' carries step {view.step}, not {step}; ask "
                           f"/v1/jobs/{job_id}/checkpoint for the newest")
        return FileResponse(path, media_type="application/octet-stream",
                            headers={"x-shoal-sha256": view.sha256})
