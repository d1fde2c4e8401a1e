"""The address quota at the door: every request is counted against its client
address (services/quotas.py) before a byte of its body is read or a signature
checked, and one past the quota is answered 429 with `Retry-After`.

The key quota is charged later, once a signature is checked (auth.py): a key is
known only then, and charging the address a key claims would let anyone spend
an honest key's quota with forged requests."""

from __future__ import annotations

import json

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from shoal.coordinator.api.metrics import CoordinatorMetrics
from shoal.coordinator.errors import RateLimited
from shoal.coordinator.services.quotas import RequestQuotas


class AddressQuota:
    def __init__(self, app: ASGIApp, quotas: RequestQuotas, metrics: CoordinatorMetrics) -> None:
        self.app, self.quotas, self.metrics = app, quotas, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The peer of the connection. Behind a reverse proxy every request has the proxy's
        # address: give that proxy its own limits, or this quota counts all clients as one.
        client = scope.get("client")
        try:
            self.quotas.charge_address(client[0] if client else "unknown")
        except RateLimited as error:
            self.metrics.refused.labels("rate_limited").inc()
            await answer_rate_limited(send, error)
            return
        await self.app(scope, receive, send)


async def answer_rate_limited(send: Send, error: RateLimited) -> None:
    body = json.dumps({"detail": str(error)}).encode()
    await send({"type": "http.response.start", "status": 429,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(error.retry_after_s).encode())]})
    await send({"type": "http.response.body", "body": body})


def limit_addresses(app: FastAPI, quotas: RequestQuotas, metrics: CoordinatorMetrics) -> None:
    """Every request of `app` counted against its client address first."""
    app.add_middleware(AddressQuota, quotas=quotas, metrics=metrics)
