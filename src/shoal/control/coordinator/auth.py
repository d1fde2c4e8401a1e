"""The API's door: a request that changes state is signed, fresh, never seen
before, and by a key whose role allows the call; otherwise 401 or 403."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from shoal.control.coordinator.errors import Forbidden
from shoal.control.coordinator.service import Coordinator
from shoal.control.identity import Signer, verify_request
from shoal.spec.coordinator import Role


async def coordinator_of(request: Request) -> Coordinator:
    return request.app.state.coordinator  # async: a sync dependency would cost a thread hop


async def raw_body(request: Request) -> bytes:
    return await request.body()


def target_of(request: Request) -> str:
    """The request line's target exactly as sent (path and query), as the client signed it."""
    target = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
    query = request.scope.get("query_string", b"").decode("latin-1")
    return f"{target}?{query}" if query else target


def signed(*roles: Role) -> Callable[..., Awaitable[Signer]]:
    """A dependency giving the verified signer; with `roles`, one of them is required.

    Every signed call passes here, a heartbeat a thousand times a second. On
    SQLite the checks run on the event loop: their statements are tens of
    microseconds on a local file, less than handing them to a worker thread
    costs. On PostgreSQL they are network round trips, which must not stall
    the loop, so they run in a worker thread.
    """

    def check(coordinator: Coordinator, request: Request, body: bytes) -> Signer:
        settings = coordinator.settings
        signer = verify_request({k.lower(): v for k, v in request.headers.items()},
                                settings.audience, request.method, target_of(request), body,
                                coordinator.now_s(), settings.max_skew_s)
        coordinator.consume_nonce(signer)
        if roles:
            role = coordinator.role_of(signer.address)
            if role not in roles:
                held = f"a {role.value}" if role else "not registered"
                wanted = " or ".join(r.value for r in roles)
                raise Forbidden(f"{signer.address} is {held}; this call needs the {wanted} role")
        return signer

    async def dependency(request: Request, body: bytes = Depends(raw_body),
                         coordinator: Coordinator = Depends(coordinator_of)) -> Signer:
        if coordinator.engine.dialect.name == "sqlite":
            return check(coordinator, request, body)
        return await run_in_threadpool(check, coordinator, request, body)

    return dependency
