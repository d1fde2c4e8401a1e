"""The API's door: a request that changes state is signed, fresh, never seen
before, within its key's quota, and by a key whose role allows the call;
otherwise 401, 429 or 403."""

from __future__ import annotations

from fastapi import Request
from starlette.types import Scope

from shoal.client.identity import Signer, verify_request
from shoal.coordinator.service import Coordinator
from shoal.coordinator.services.participants import refuse_role
from shoal.spec.coordinator import Role


def target_of(scope: Scope) -> str:
    """The request line's target exactly as sent (path and query), as the client signed it."""
    target = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    return f"{target}?{query}" if query else target


def verified_signer(coordinator: Coordinator, request: Request, body: bytes,
                    roles: tuple[Role, ...]) -> Signer:
    """The request's signer, once its signature, freshness and nonce are checked and,
    with `roles`, its role is one of them (deps.signed runs this for every route)."""
    settings = coordinator.settings
    signer = verify_request({k.lower(): v for k, v in request.headers.items()},
                            settings.audience, request.method, target_of(request.scope), body,
                            coordinator.desk.now_s(), settings.max_skew_s)
    coordinator.participants.consume_nonce(signer)
    # After the nonce: a replayed copy of a key's request is refused unanswered, never
    # charged to the key (a refused request's nonce is spent; the client signs afresh).
    coordinator.quotas.charge_key(signer.address)
    if roles:
        refuse_role(signer.address, coordinator.participants.role_of(signer.address), roles)
    return signer


def beat_signer(coordinator: Coordinator, scope: Scope, body: bytes, now: float) -> Signer:
    """A heartbeat's signer, its signature checked on the event loop (a tenth of a
    millisecond). Its nonce and role are checked by `take_signed_beat`, in the one
    group-committed transaction that takes the beat; its quota is charged here."""
    settings = coordinator.settings
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    signer = verify_request(headers, settings.audience, scope["method"], target_of(scope), body,
                            now, settings.max_skew_s)
    coordinator.quotas.charge_key(signer.address)
    return signer
