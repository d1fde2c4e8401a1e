"""The API's routes on a job's work: agents upload work records and step
progress and answer challenges, verifiers raise challenges and file signed
verdicts, anyone who opened a dispute on the contract brings it here, anyone
reads progress, membership, the planner's view of the
members, epochs, records, challenged files and verdicts."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Response
from fastapi.responses import FileResponse

from shoal.coordinator.api.auth import coordinator_of, raw_body, signed
from shoal.coordinator.service import Coordinator
from shoal.client.identity import Signer
from shoal.spec.audit import (
    ChallengeView, Challenges, DisputeFiling, DisputeView, JobFile, ProofEpochView, RecordUpload,
    UploadReceipt, VerdictFiling, VerdictView,
)
from shoal.spec.coordinator import Role
from shoal.spec.progress import JobPlanView, MembershipChange, ProgressUpload, StepProgress
from shoal.spec.proof import WorkRecord

JobPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ChallengePath = Annotated[int, Path(ge=1, le=2**62)]
Co = Annotated[Coordinator, Depends(coordinator_of)]
ProviderSigner = Annotated[Signer, Depends(signed(Role.provider))]
VerifierSigner = Annotated[Signer, Depends(signed(Role.verifier, Role.operator))]
AnySigner = Annotated[Signer, Depends(signed())]  # a dispute's bond on chain is its standing
# The answer's body is a file, not JSON (its path is in file_admission.FILE_UPLOADS).
FILE_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


def proof_routes(app: FastAPI) -> None:
    @app.post("/v1/jobs/{job_id}/progress", tags=["jobs"])
    def upload_progress(job_id: JobPath, body: ProgressUpload, co: Co,
                        signer: ProviderSigner) -> dict[str, int]:
        return {"stored": co.progress.record(signer.address, job_id, body)}

    @app.get("/v1/jobs/{job_id}/progress", tags=["jobs"])
    def progress(job_id: JobPath, co: Co,
                 after: Annotated[int, Query(ge=-1, le=2**62)] = -1) -> list[StepProgress]:
        return co.progress.steps(job_id, after)

    @app.get("/v1/jobs/{job_id}/membership", tags=["jobs"])
    def membership(job_id: JobPath, co: Co) -> list[MembershipChange]:
        return co.progress.membership(job_id)

    @app.get("/v1/jobs/{job_id}/plan", tags=["jobs"])
    def plan(job_id: JobPath, co: Co) -> JobPlanView | None:
        return co.planning.job_plan(job_id)

    @app.post("/v1/jobs/{job_id}/proof/records", tags=["proof"])
    def upload_records(job_id: JobPath, body: RecordUpload, co: Co,
                       signer: ProviderSigner) -> UploadReceipt:
        return co.upload_records(signer.address, job_id, body)

    @app.get("/v1/jobs/{job_id}/proof/records", tags=["proof"])
    def records(job_id: JobPath, co: Co,
                epoch: Annotated[int, Query(ge=0, le=2**62)]) -> list[WorkRecord]:
        co.reads.job(job_id)  # 404 for a job that does not exist
        return co.served_records(job_id, epoch)  # forced errors in (plants.py)

    @app.get("/v1/jobs/{job_id}/job-file", tags=["jobs"])
    def job_file(job_id: JobPath, co: Co) -> JobFile:
        return JobFile(job_id=job_id, job_file=co.job_file(job_id))

    @app.get("/v1/jobs/{job_id}/proof/epochs", tags=["proof"])
    def epochs(job_id: JobPath, co: Co) -> list[ProofEpochView]:
        return co.served_epochs(job_id)

    @app.post("/v1/jobs/{job_id}/proof/challenges", tags=["proof"], status_code=201)
    def raise_challenges(job_id: JobPath, body: Challenges, co: Co,
                         signer: VerifierSigner) -> list[ChallengeView]:
        return co.raise_challenges(signer.address, job_id, body.items)

    @app.get("/v1/jobs/{job_id}/proof/challenges", tags=["proof"])
    def challenges(job_id: JobPath, co: Co) -> list[ChallengeView]:
        co.reads.job(job_id)
        return co.challenges(job_id)

    @app.put("/v1/challenges/{challenge}/answer", tags=["proof"], openapi_extra=FILE_BODY)
    def answer(challenge: ChallengePath, co: Co, signer: ProviderSigner,
               data: Annotated[bytes, Depends(raw_body)]) -> ChallengeView:
        return co.answer_challenge(signer.address, challenge, data)

    @app.get("/v1/challenges/{challenge}/file", tags=["proof"], response_class=Response,
             responses={200: {"content": {"application/octet-stream": {}}}})
    def challenge_file(challenge: ChallengePath, co: Co) -> FileResponse:
        return FileResponse(co.challenge_file(challenge), media_type="application/octet-stream")

    @app.post("/v1/jobs/{job_id}/proof/verdicts", tags=["proof"], status_code=201)
    def file_verdicts(job_id: JobPath, body: VerdictFiling, co: Co,
                      signer: VerifierSigner) -> list[VerdictView]:
        return co.file_verdicts(signer.address, job_id, body)

    @app.get("/v1/jobs/{job_id}/proof/verdicts", tags=["proof"])
    def verdicts(job_id: JobPath, co: Co) -> list[VerdictView]:
        co.reads.job(job_id)
        return co.verdicts(job_id)

    @app.post("/v1/jobs/{job_id}/proof/disputes", tags=["proof"], status_code=201)
    def file_dispute(job_id: JobPath, body: DisputeFiling, co: Co,
                     signer: AnySigner) -> DisputeView:
        return co.file_dispute(signer.address, job_id, body)

    @app.get("/v1/jobs/{job_id}/proof/disputes", tags=["proof"])
    def disputes(job_id: JobPath, co: Co) -> list[DisputeView]:
        co.reads.job(job_id)
        return co.disputes(job_id)
