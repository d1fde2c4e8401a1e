"""The API's routes on job bundles: a submitter sends one (before the job that names
it); the submitter and the providers of its jobs fetch it. Who may do which is
decided in `services/bundles.py`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.responses import FileResponse

from shoal.coordinator.api.deps import (
    FILE_BODY, FILE_REPLY, AnySigner, Co, RawBody, SubmitterSigner,
)
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.bundle import BundleManifest
from shoal.spec.proof import SHA256_HEX

router = APIRouter(tags=["bundles"], responses=PROBLEMS)

Sha256Path = Annotated[str, Path(pattern=SHA256_HEX)]


@router.put("/v1/bundles/{sha256}", openapi_extra=FILE_BODY)
def upload(sha256: Sha256Path, co: Co, signer: SubmitterSigner, data: RawBody) -> BundleManifest:
    return co.bundles.put(signer.address, sha256, data)


@router.get("/v1/bundles/{sha256}", response_class=Response, responses=FILE_REPLY)
def download(sha256: Sha256Path, co: Co, signer: AnySigner) -> FileResponse:
    return FileResponse(co.bundles.read(signer.address, sha256),
                        media_type="application/octet-stream",
                        headers={"x-shoal-sha256": sha256})
