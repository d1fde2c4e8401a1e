"""The API's door: a request that changes state is signed, fresh, never seen
before, and by a key whose role allows the call; otherwise 401 or 403."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from shoal.coordinator.service import Coordinator
from shoal.coordinator.services.participants import refuse_role
from shoal.client.identity import Signer, verify_request
from shoal.spec.coordinator import Heartbeat, Role


async def coordinator_of(request: Request) -> Coordinator:
    return request.app.state.coordinator  # async: a sync dependency would cost a thread hop


async def raw_body(request: Request) -> bytes:
    return await request.body()


def target_of(scope: Scope) -> str:
    """The request line's target exactly as sent (path and query), as the client signed it."""
    target = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{target}?{query}" if query else target


def signed(*roles: Role) -> Callable[..., Awaitable[Signer]]:
    """A dependency giving the verified signer; with `roles`, one of them is required.

    On SQLite the checks run on the event loop: their statements are tens of
    microseconds on a local file, less than handing them to a worker thread
    costs. On PostgreSQL they are network round trips, which must not stall
    the loop, so they run in a worker thread. (Heartbeats, the bulk of
    signed calls, take `signed_beat` instead.)
    """

    def check(coordinator: Coordinator, request: Request, body: bytes) -> Signer:
        settings = coordinator.settings
        signer = verify_request({k.lower(): v for k, v in request.headers.items()},
                                settings.audience, request.method, target_of(request.scope), body,
                                coordinator.desk.now_s(), settings.max_skew_s)
        coordinator.participants.consume_nonce(signer)
        if roles:
            refuse_role(signer.address, coordinator.participants.role_of(signer.address), roles)
        return signer

    async def dependency(request: Request, body: bytes = Depends(raw_body),
                         coordinator: Coordinator = Depends(coordinator_of)) -> Signer:
        if coordinator.engine.dialect.name == "sqlite":
            return check(coordinator, request, body)
        return await run_in_threadpool(check, coordinator, request, body)

    return dependency


async def signed_beat(coordinator: Coordinator, scope: Scope, body: bytes, agent_id: str,
                      beat: Heartbeat) -> tuple[Signer, Any]:  # Any: the store's BeatTaken
    """A provider's signed heartbeat, checked as `signed(Role.provider)` checks any call,
    and taken with its nonce and role check in one group-committed transaction.

    The signature is checked here on the event loop (a tenth of a millisecond);
    the store work waits on the group commit without holding the loop, and
    this returns only after the transaction holding the nonce has committed.
    """
    settings = coordinator.settings
    now = coordinator.desk.now_s()
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    signer = verify_request(headers, settings.audience, scope["method"], target_of(scope), body,
                            now, settings.max_skew_s)
    taken = await asyncio.wrap_future(
        coordinator.participants.take_signed_beat(signer, agent_id, beat.running, now))
    coordinator.participants.refuse_signed_beat(signer.address, taken)
    return signer, taken
