"""What a route asks FastAPI for: the coordinator serving it, the raw body, and a
verified signer of the role the call needs. Declared once here, so every router
checks a signed call the same way (auth.py holds the checks themselves)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from starlette.concurrency import run_in_threadpool

from shoal.client.identity import Signer
from shoal.coordinator.api.auth import verified_signer
from shoal.coordinator.service import Coordinator
from shoal.spec.coordinator import MAX_PAGE, Role


async def coordinator_of(request: Request) -> Coordinator:
    return request.app.state.coordinator  # async: a sync dependency would cost a thread hop


async def raw_body(request: Request) -> bytes:
    return await request.body()


def signed(*roles: Role) -> Callable[..., Awaitable[Signer]]:
    """A dependency giving the verified signer; with `roles`, one of them is required.

    On SQLite the checks run on the event loop: their statements are tens of
    microseconds on a local file, less than handing them to a worker thread
    costs. On PostgreSQL they are network round trips, which must not stall
    the loop, so they run in a worker thread. (Heartbeats, the bulk of
    signed calls, take the lean path of fast_heartbeat.py instead.)
    """

    async def dependency(request: Request, body: bytes = Depends(raw_body),
                         coordinator: Coordinator = Depends(coordinator_of)) -> Signer:
        if coordinator.engine.dialect.name == "sqlite":
            return verified_signer(coordinator, request, body, roles)
        return await run_in_threadpool(verified_signer, coordinator, request, body, roles)

    return dependency


Co = Annotated[Coordinator, Depends(coordinator_of)]
RawBody = Annotated[bytes, Depends(raw_body)]
AnySigner = Annotated[Signer, Depends(signed())]
OperatorSigner = Annotated[Signer, Depends(signed(Role.operator))]
ProviderSigner = Annotated[Signer, Depends(signed(Role.provider))]
SubmitterSigner = Annotated[Signer, Depends(signed(Role.submitter))]
OwnerSigner = Annotated[Signer, Depends(signed(Role.submitter, Role.operator))]  # of a job
VerifierSigner = Annotated[Signer, Depends(signed(Role.verifier, Role.operator))]

# A job's, agent's or offer's name in a path (fast_heartbeat.LABEL matches the same).
LabelPath = Annotated[str, Path(min_length=1, max_length=64,
                                pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
# A listing's page (spec.coordinator.MAX_PAGE): at most `limit` rows, those after the key
# `after` (the last row of the page before: a label, or an address).
PageLimit = Annotated[int, Query(ge=1, le=MAX_PAGE)]
AfterLabel = Annotated[str | None, Query(min_length=1, max_length=64)]
AfterAddress = Annotated[str | None, Query(min_length=1, max_length=42)]
NumberPath = Annotated[int, Path(ge=1, le=2**62)]  # a lease or a challenge
StepPath = Annotated[int, Path(ge=0, le=2**62)]

# A body that is a file a worker wrote, not JSON (its path is in file_admission.FILE_UPLOADS).
FILE_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
FILE_REPLY = {200: {"content": {"application/octet-stream": {}}}}
