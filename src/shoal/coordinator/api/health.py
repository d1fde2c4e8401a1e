"""The service's own routes: is it up, the terms a client signs under (audience,
heartbeat, clock skew), and its Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shoal import __version__
from shoal.coordinator.api.deps import Co
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.coordinator import Info

router = APIRouter(tags=["service"], responses=PROBLEMS)


@router.get("/healthz")
def healthz() -> dict[str, bool]:
    return {"ok": True}


@router.get("/v1/info")
def info(co: Co) -> Info:
    s = co.settings
    return Info(audience=s.audience, version=__version__, heartbeat_s=s.heartbeat_s,
                max_skew_s=s.max_skew_s)


@router.get("/metrics", response_class=Response)
def prometheus(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
