"""Who is who: a key registers itself (as a provider, submitter or verifier), an
operator grants a role, and anyone reads the list."""

from __future__ import annotations

from fastapi import APIRouter

from shoal.coordinator.api.deps import AnySigner, Co, OperatorSigner
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.coordinator import Grant, Participant, Registration

router = APIRouter(tags=["identity"], responses=PROBLEMS)


@router.post("/v1/participants", status_code=201)
def register(body: Registration, co: Co, signer: AnySigner) -> Participant:
    return co.participants.register(signer.address, body)


@router.post("/v1/grants", status_code=201)
def grant(body: Grant, co: Co, signer: OperatorSigner) -> Participant:
    return co.participants.grant(signer.address, body)


@router.get("/v1/participants")
def participants(co: Co) -> list[Participant]:
    return co.participants.registered()
