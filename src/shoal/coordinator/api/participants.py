"""Who is who: a key registers itself (as a provider, submitter or verifier), an
operator grants a role, and anyone reads the list (a page at a time)."""

from __future__ import annotations

from fastapi import APIRouter

from shoal.coordinator.api.deps import AfterAddress, AnySigner, Co, OperatorSigner, PageLimit
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.coordinator import DEFAULT_PAGE, Grant, Participant, Registration

router = APIRouter(tags=["identity"], responses=PROBLEMS)


@router.post("/v1/participants", status_code=201)
def register(body: Registration, co: Co, signer: AnySigner) -> Participant:
    return co.participants.register(signer.address, body)


@router.post("/v1/grants", status_code=201)
def grant(body: Grant, co: Co, signer: OperatorSigner) -> Participant:
    return co.participants.grant(signer.address, body)


@router.get("/v1/participants")
def participants(co: Co, after: AfterAddress = None,
                 limit: PageLimit = DEFAULT_PAGE) -> list[Participant]:
    """Participants by address, a page at a time: pass the page's last address as `after`
    for the next one (a page shorter than `limit` is the last)."""
    return co.participants.registered(after, limit)
