"""The routes of proof of learning on a job's work: agents upload work records and
answer challenges with the files asked for; verifiers raise challenges and file
signed verdicts; anyone reads epochs, records, challenges, their files and verdicts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import FileResponse

from shoal.coordinator.api.deps import (
    AnySigner, FILE_BODY, FILE_REPLY, Co, LabelPath, NumberPath, ProviderSigner, RawBody, VerifierSigner,
)
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.audit import (
    ChallengeView, Challenges, ProofEpochView, RecordUpload, UploadReceipt, VerdictFiling,
    VerdictView,
)
from shoal.spec.proof import WorkRecord

router = APIRouter(tags=["proof"], responses=PROBLEMS)


@router.post("/v1/jobs/{job_id}/proof/records")
def upload_records(job_id: LabelPath, body: RecordUpload, co: Co,
                   signer: ProviderSigner) -> UploadReceipt:
    return co.records.upload_records(signer.address, job_id, body)


@router.get("/v1/jobs/{job_id}/proof/records")
def records(job_id: LabelPath, co: Co,
            epoch: Annotated[int, Query(ge=0, le=2**62)]) -> list[WorkRecord]:
    co.reads.job(job_id)  # 404 for a job that does not exist
    return co.plants.served_records(job_id, epoch)  # forced errors in (plants.py)


@router.get("/v1/jobs/{job_id}/proof/epochs")
def epochs(job_id: LabelPath, co: Co) -> list[ProofEpochView]:
    return co.plants.served_epochs(job_id)


@router.post("/v1/jobs/{job_id}/proof/challenges", status_code=201)
def raise_challenges(job_id: LabelPath, body: Challenges, co: Co,
                     signer: VerifierSigner) -> list[ChallengeView]:
    return co.challenges.raise_challenges(signer.address, job_id, body.items)


@router.get("/v1/jobs/{job_id}/proof/challenges")
def challenges(job_id: LabelPath, co: Co) -> list[ChallengeView]:
    co.reads.job(job_id)
    return co.challenges.of_job(job_id)


@router.put("/v1/challenges/{challenge}/answer", openapi_extra=FILE_BODY)
def answer(challenge: NumberPath, co: Co, signer: ProviderSigner, data: RawBody) -> ChallengeView:
    return co.challenges.answer_challenge(signer.address, challenge, data)


@router.get("/v1/challenges/{challenge}/file", response_class=Response, responses=FILE_REPLY)
def challenge_file(challenge: NumberPath, co: Co, signer: AnySigner) -> FileResponse:
    """Signed: a job's files are its model, shown only to its verifiers, submitter and
    lease holders."""
    path = co.challenges.challenge_file(challenge, signer.address,
                                        co.participants.role_of(signer.address))
    return FileResponse(path, media_type="application/octet-stream")


@router.post("/v1/jobs/{job_id}/proof/verdicts", status_code=201)
def file_verdicts(job_id: LabelPath, body: VerdictFiling, co: Co,
                  signer: VerifierSigner) -> list[VerdictView]:
    return co.verdicts.file_verdicts(signer.address, job_id, body)


@router.get("/v1/jobs/{job_id}/proof/verdicts")
def verdicts(job_id: LabelPath, co: Co) -> list[VerdictView]:
    co.reads.job(job_id)
    return co.verdicts.of_job(job_id)
