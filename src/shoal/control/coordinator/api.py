"""The coordinator's HTTP API (FastAPI; its OpenAPI description at /openapi.json).

Routes only translate: a verified signer and a validated body in, a view
out. The service decides; its errors become 4xx here and nowhere else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shoal import __version__
from shoal.control.coordinator.auth import coordinator_of, signed
from shoal.control.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.control.coordinator.limits import BodyLimit
from shoal.control.coordinator.metrics import CoordinatorMetrics, state_gauges
from shoal.control.coordinator.rounds import RoundLoop
from shoal.control.coordinator.service import Coordinator
from shoal.control.errors import ControlError
from shoal.control.identity import Signer, Unauthenticated
from shoal.market import MarketError
from shoal.spec.coordinator import (
    AgentRegistration, AgentView, Event, Grant, Heartbeat, HeartbeatReply, Info, JobStatus,
    JobSubmission, JobView, OfferTerms, OfferView, Participant, Problem, ProviderView,
    Registration, Role, TopUp,
)
from shoal.spec.errors import SpecError
from shoal.spec.ledger import LeaseAcceptance

log = logging.getLogger(__name__)
LabelPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Co = Annotated[Coordinator, Depends(coordinator_of)]
AnySigner = Annotated[Signer, Depends(signed())]
OperatorSigner = Annotated[Signer, Depends(signed(Role.operator))]
ProviderSigner = Annotated[Signer, Depends(signed(Role.provider))]
SubmitterSigner = Annotated[Signer, Depends(signed(Role.submitter))]
OwnerSigner = Annotated[Signer, Depends(signed(Role.submitter, Role.operator))]
PROBLEMS = {status: {"model": Problem} for status in (401, 403, 404, 409, 413)}

# Which refusal each error family is, at the edge (STYLE.md 6).
STATUS: tuple[tuple[type[Exception], int, str], ...] = (
    (Unauthenticated, 401, "unauthenticated"),
    (Forbidden, 403, "forbidden"),
    (NotFound, 404, "not_found"),
    (Conflict, 409, "conflict"),
    (MarketError, 409, "market"),
    (SpecError, 422, "invalid"),
    (ControlError, 400, "bad_request"),
)


def create_app(coordinator: Coordinator, run_rounds: bool = True) -> FastAPI:
    """The API over `coordinator`; with `run_rounds`, its market loop runs while the app does."""
    metrics = CoordinatorMetrics()
    metrics.add_state(state_gauges(coordinator))
    rounds = RoundLoop(coordinator, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if run_rounds:
            rounds.start()
        yield
        if run_rounds:
            rounds.stop()

    app = FastAPI(title="shoal coordinator", version=__version__, lifespan=lifespan,
                  responses=PROBLEMS)
    app.state.coordinator, app.state.metrics, app.state.rounds = coordinator, metrics, rounds
    app.add_middleware(BodyLimit, max_bytes=coordinator.settings.max_body_bytes)
    _errors(app, metrics)
    _timing(app, metrics)
    _routes(app)
    return app


def _errors(app: FastAPI, metrics: CoordinatorMetrics) -> None:
    for family, status, reason in STATUS:
        def handler(_: Request, error: Exception, status: int = status, reason: str = reason):
            metrics.refused.labels(reason).inc()
            return JSONResponse({"detail": str(error)}, status_code=status)

        app.add_exception_handler(family, handler)


def _timing(app: FastAPI, metrics: CoordinatorMetrics) -> None:
    @app.middleware("http")
    async def timed(request: Request, call_next):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        metrics.requests.labels(request.method, getattr(route, "path", "unmatched"),
                                str(response.status_code)).observe(time.perf_counter() - start)
        return response


def _routes(app: FastAPI) -> None:
    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/v1/info", tags=["service"])
    def info(co: Co) -> Info:
        s = co.settings
        return Info(audience=s.audience, version=__version__, heartbeat_s=s.heartbeat_s,
                    max_skew_s=s.max_skew_s)

    @app.get("/metrics", tags=["service"], response_class=Response)
    def prometheus(request: Request) -> Response:
        return Response(generate_latest(request.app.state.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    # ---------------------------------------------------------------- identity
    @app.post("/v1/participants", tags=["identity"], status_code=201)
    def register(body: Registration, co: Co,
                 signer: AnySigner) -> Participant:
        return co.register(signer.address, body)

    @app.post("/v1/grants", tags=["identity"], status_code=201)
    def grant(body: Grant, co: Co,
              signer: OperatorSigner) -> Participant:
        return co.grant(signer.address, body)

    @app.get("/v1/participants", tags=["identity"])
    def participants(co: Co) -> list[Participant]:
        return co.participants()

    # ---------------------------------------------------------------- providers
    @app.post("/v1/agents", tags=["providers"], status_code=201)
    def register_agent(body: AgentRegistration, co: Co, signer: ProviderSigner) -> AgentView:
        return co.register_agent(signer.address, body)

    @app.get("/v1/agents", tags=["providers"])
    def agents(co: Co) -> list[AgentView]:
        return co.agents()

    @app.post("/v1/agents/{agent_id}/heartbeat", tags=["providers"])
    def heartbeat(agent_id: LabelPath, body: Heartbeat, co: Co, signer: ProviderSigner,
                  request: Request) -> HeartbeatReply:
        reply = co.heartbeat(signer.address, agent_id, body)
        request.app.state.metrics.heartbeats.inc()
        return reply

    @app.post("/v1/offers", tags=["providers"], status_code=201)
    def post_offer(body: OfferTerms, co: Co, signer: ProviderSigner) -> OfferView:
        return co.post_offer(signer.address, body)

    @app.delete("/v1/offers/{offer_id}", tags=["providers"])
    def withdraw_offer(offer_id: LabelPath, co: Co, signer: ProviderSigner) -> OfferView:
        return co.withdraw_offer(signer.address, offer_id)

    @app.post("/v1/leases/{lease}/acceptance", tags=["providers"], status_code=204)
    def accept_lease(lease: Annotated[int, Path(ge=1, le=2**62)], body: LeaseAcceptance, co: Co,
                     signer: ProviderSigner) -> Response:
        co.accept_lease(signer.address, lease, body)
        return Response(status_code=204)

    @app.get("/v1/offers", tags=["providers"])
    def offers(co: Co) -> list[OfferView]:
        return co.offers()

    @app.get("/v1/providers", tags=["providers"])
    def providers(co: Co) -> list[ProviderView]:
        agents, offers = co.agents(), co.offers()
        return [ProviderView(address=p.address, name=p.name,
                             agents=tuple(a for a in agents if a.provider == p.address),
                             offers=tuple(o for o in offers if o.provider == p.address))
                for p in co.participants() if p.role is Role.provider]

    # ---------------------------------------------------------------- submitters
    @app.post("/v1/jobs", tags=["jobs"], status_code=201)
    def submit(body: JobSubmission, co: Co, signer: SubmitterSigner) -> JobView:
        return co.submit_job(signer.address, body)

    @app.get("/v1/jobs", tags=["jobs"])
    def jobs(co: Co, submitter: Annotated[str | None, Query(max_length=42)] = None) -> list[JobView]:
        return co.jobs(submitter)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    def job(job_id: LabelPath, co: Co) -> JobView:
        return co.job(job_id)

    @app.post("/v1/jobs/{job_id}/top-up", tags=["jobs"])
    def top_up(job_id: LabelPath, body: TopUp, co: Co, signer: SubmitterSigner) -> JobView:
        return co.top_up(signer.address, job_id, body.amount_wei)

    @app.post("/v1/jobs/{job_id}/pause", tags=["jobs"])
    def pause(job_id: LabelPath, co: Co, signer: OwnerSigner) -> JobView:
        return co.set_paused(signer.address, job_id, True)

    @app.post("/v1/jobs/{job_id}/resume", tags=["jobs"])
    def resume(job_id: LabelPath, co: Co, signer: OwnerSigner) -> JobView:
        return co.set_paused(signer.address, job_id, False)

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"])
    def cancel(job_id: LabelPath, co: Co, signer: OwnerSigner) -> JobView:
        return co.end_job(signer.address, job_id, JobStatus.cancelled)

    # ---------------------------------------------------------------- audit log
    @app.get("/v1/events", tags=["events"])
    def events(co: Co, job: Annotated[str | None, Query(max_length=64)] = None,
               after: Annotated[int, Query(ge=0, le=2**62)] = 0,
               limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> list[Event]:
        return co.events(job, after, limit)
