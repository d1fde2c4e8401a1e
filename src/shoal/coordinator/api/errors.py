"""Which refusal each error family is at the HTTP edge (STYLE.md 6): the layers below
raise their own exceptions, and only here do they become a 4xx with a JSON body."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from shoal.client.identity import Unauthenticated
from shoal.coordinator.api.metrics import CoordinatorMetrics
from shoal.coordinator.errors import Conflict, Forbidden, Gone, NotFound, RateLimited
from shoal.errors import ControlError
from shoal.market import MarketError
from shoal.spec.coordinator import Problem
from shoal.spec.errors import SpecError

# Every operation may answer these, with a `Problem` body (in /openapi.json).
PROBLEMS = {status: {"model": Problem} for status in (401, 403, 404, 409, 410, 413, 429)}

STATUS: tuple[tuple[type[Exception], int, str], ...] = (
    (Unauthenticated, 401, "unauthenticated"),
    (Forbidden, 403, "forbidden"),
    (NotFound, 404, "not_found"),
    (Conflict, 409, "conflict"),
    (Gone, 410, "gone"),
    (MarketError, 409, "market"),
    (SpecError, 422, "invalid"),
    (RateLimited, 429, "rate_limited"),
    (ControlError, 400, "bad_request"),
)


def refusal_of(error: Exception) -> tuple[int, str] | None:
    """The status and the metrics' reason for `error`; None for an error that is a bug."""
    for family, status, reason in STATUS:
        if isinstance(error, family):
            return status, reason
    return None


def answer_errors(app: FastAPI, metrics: CoordinatorMetrics) -> None:
    """Each family's refusal, counted under its reason in `shoal_requests_refused_total`."""
    for family, status, reason in STATUS:
        def handler(_: Request, error: Exception, status: int = status, reason: str = reason):
            metrics.refused.labels(reason).inc()
            # A quota's refusal says when to ask again (RFC 9110's Retry-After, in seconds).
            headers = {"Retry-After": str(error.retry_after_s)} \
                if isinstance(error, RateLimited) else None
            return JSONResponse({"detail": str(error)}, status_code=status, headers=headers)

        app.add_exception_handler(family, handler)
