"""The coordinator's HTTP API (FastAPI; its OpenAPI description at /openapi.json).

Routes only translate: a verified signer and a validated body in, a view
out. The service decides; its errors become 4xx here and nowhere else.
"""

from __future__ import annotations

import gc
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Message, Receive, Scope, Send

from shoal import __version__
from shoal.coordinator.api.checkpoints import checkpoint_routes
from shoal.coordinator.api.probe import probe_routes
from shoal.coordinator.api.proofs import proof_routes
from shoal.coordinator.api.auth import coordinator_of, signed, signed_beat, target_of
from shoal.coordinator.errors import Conflict, Forbidden, Gone, NotFound
from shoal.coordinator.services.file_admission import FILE_UPLOADS
from shoal.coordinator.api.limits import BodyLimit
from shoal.coordinator.api.metrics import CoordinatorMetrics, TimedRequests, state_gauges
from shoal.coordinator.rounds import RoundLoop
from shoal.coordinator.service import Coordinator
from shoal.coordinator.dashboard.routes import dashboard_routes
from shoal.errors import ControlError
from shoal.client.identity import Signer, Unauthenticated
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
PROBLEMS = {status: {"model": Problem} for status in (401, 403, 404, 409, 410, 413)}

# Which refusal each error family is, at the edge (STYLE.md 6).
STATUS: tuple[tuple[type[Exception], int, str], ...] = (
    (Unauthenticated, 401, "unauthenticated"),
    (Forbidden, 403, "forbidden"),
    (NotFound, 404, "not_found"),
    (Conflict, 409, "conflict"),
    (Gone, 410, "gone"),
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
        # What the process holds at start (~350k objects: the libraries, the app)
        # lives as long as it does: out of the collector's sight, a full
        # collection under load costs milliseconds, not a 100-300 ms stall of
        # every request in flight.
        gc.collect()
        gc.freeze()
        if run_rounds:
            rounds.start()
        yield
        if run_rounds:
            rounds.stop()

    app = FastAPI(title="shoal coordinator", version=__version__, lifespan=lifespan,
                  responses=PROBLEMS)
    app.state.coordinator, app.state.metrics, app.state.rounds = coordinator, metrics, rounds
    app.add_middleware(BodyLimit, max_bytes=coordinator.settings.max_body_bytes,
                       file_bytes=coordinator.settings.max_file_bytes,
                       file_paths=FILE_UPLOADS,
                       admit=_file_admission(coordinator, metrics))
    _errors(app, metrics)
    _timing(app, metrics)
    app.router.routes.extend(_api_routes())
    if coordinator.settings.dashboard:
        dashboard_routes(app)
    _fast_heartbeats(app, coordinator, metrics)
    return app


_built: list[BaseRoute] = []  # the API's routes, once built (see `_api_routes`)


def _api_routes() -> list[BaseRoute]:
    """The API's routes. Each reads its coordinator, metrics and round loop from the
    serving app's state, never from where it was built, so one build serves every app
    this process makes: building them (pydantic adapters for each route's models) takes
    0.4 s or more, which every coordinator a test suite starts paid again."""
    if not _built:
        template = FastAPI(responses=PROBLEMS)
        own = len(template.router.routes)  # its docs and OpenAPI routes are its own
        _routes(template)
        proof_routes(template)
        probe_routes(template)
        checkpoint_routes(template)
        _built.extend(template.router.routes[own:])
    return _built


def _errors(app: FastAPI, metrics: CoordinatorMetrics) -> None:
    for family, status, reason in STATUS:
        def handler(_: Request, error: Exception, status: int = status, reason: str = reason):
            metrics.refused.labels(reason).inc()
            return JSONResponse({"detail": str(error)}, status_code=status)

        app.add_exception_handler(family, handler)


def _file_admission(coordinator: Coordinator, metrics: CoordinatorMetrics):
    """BodyLimit's check of a large file's signed headers, answered as the API answers
    an error (file_admission.py)."""

    def check(scope: Scope) -> tuple[int, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            coordinator.files.admit_file(headers, scope["method"], scope["path"], target_of(scope),
                                   scope.get("query_string", b"").decode("latin-1"))
        except Exception as error:  # noqa: BLE001 - mapped as the API's handlers map it
            for family, status, reason in STATUS:
                if isinstance(error, family):
                    metrics.refused.labels(reason).inc()
                    return status, str(error)
            raise
        return None

    async def admit(scope: Scope) -> tuple[int, str] | None:
        if coordinator.engine.dialect.name == "sqlite":  # as `signed` does: see auth.py
            return check(scope)
        return await run_in_threadpool(check, scope)

    return admit


def _timing(app: FastAPI, metrics: CoordinatorMetrics) -> None:
    app.add_middleware(TimedRequests, metrics=metrics)


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
        return co.participants.register(signer.address, body)

    @app.post("/v1/grants", tags=["identity"], status_code=201)
    def grant(body: Grant, co: Co,
              signer: OperatorSigner) -> Participant:
        return co.participants.grant(signer.address, body)

    @app.get("/v1/participants", tags=["identity"])
    def participants(co: Co) -> list[Participant]:
        return co.participants.registered()

    # ---------------------------------------------------------------- providers
    @app.post("/v1/agents", tags=["providers"], status_code=201)
    def register_agent(body: AgentRegistration, co: Co, signer: ProviderSigner) -> AgentView:
        return co.register_agent(signer.address, body)

    @app.get("/v1/agents", tags=["providers"])
    def agents(co: Co) -> list[AgentView]:
        return co.reads.agents()

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
        return co.reads.offers()

    @app.get("/v1/providers", tags=["providers"])
    def providers(co: Co) -> list[ProviderView]:
        agents, offers = co.reads.agents(), co.reads.offers()
        return [ProviderView(address=p.address, name=p.name,
                             agents=tuple(a for a in agents if a.provider == p.address),
                             offers=tuple(o for o in offers if o.provider == p.address))
                for p in co.participants.registered() if p.role is Role.provider]

    # ---------------------------------------------------------------- submitters
    @app.post("/v1/jobs", tags=["jobs"], status_code=201)
    def submit(body: JobSubmission, co: Co, signer: SubmitterSigner) -> JobView:
        return co.submit_job(signer.address, body)

    @app.get("/v1/jobs", tags=["jobs"])
    def jobs(co: Co, submitter: Annotated[str | None, Query(max_length=42)] = None) -> list[JobView]:
        return co.reads.jobs(submitter)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    def job(job_id: LabelPath, co: Co) -> JobView:
        return co.reads.job(job_id)

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
        return co.reads.events(job, after, limit)


# ---------------------------------------------------------------- the heartbeat's lean path
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # LabelPath, matched whole


class FastHeartbeat(Route):
    """POST /v1/agents/{agent_id}/heartbeat without FastAPI's per-request machinery.

    A thousand agents beat every second, and FastAPI's dependency solving and
    its validation of the reply cost several times the beat itself. Matched
    before the declared route, this takes a well-formed beat (a JSON
    `Heartbeat` for a valid agent label) straight through the same checks
    (`signed_beat`: signature, nonce, provider role) and `Coordinator.heartbeat`.
    Anything else is handed to the declared route, which documents the call
    in /openapi.json and answers it exactly as before.
    """

    def __init__(self, declared: APIRoute, coordinator: Coordinator,
                 metrics: CoordinatorMetrics) -> None:
        super().__init__(declared.path, declared.endpoint, methods=["POST"], include_in_schema=False)
        self.declared, self.coordinator, self.metrics = declared, coordinator, metrics

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self.declared  # timed under the declared route's template
        return match, child_scope

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody is left to answer
            body, more = body + message.get("body", b""), message.get("more_body", False)
        agent_id = scope["path_params"]["agent_id"]
        beat = _well_formed(scope, agent_id, body)
        if beat is None:
            await self.declared.handle(scope, _replayed(body), send)
            return
        signer, taken = await signed_beat(self.coordinator, scope, body, agent_id, beat)
        reply = self.coordinator.heartbeat(signer.address, agent_id, beat, taken)
        self.metrics.heartbeats.inc()
        payload = reply.model_dump_json().encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


def _well_formed(scope: Scope, agent_id: str, body: bytes) -> Heartbeat | None:
    """The beat, when FastAPI would take this request's path and body as they are."""
    content_types = [value for name, value in scope["headers"] if name.lower() == b"content-type"]
    if content_types != [b"application/json"] or not _LABEL.fullmatch(agent_id):
        return None
    try:
        return Heartbeat.model_validate_json(body)
    except ValidationError:
        return None


def _replayed(body: bytes) -> Receive:
    """A receive that hands the already-read `body` over again."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _fast_heartbeats(app: FastAPI, coordinator: Coordinator, metrics: CoordinatorMetrics) -> None:
    declared = next(route for route in app.router.routes if isinstance(route, APIRoute)
                    and route.path == "/v1/agents/{agent_id}/heartbeat")
    app.router.routes.insert(0, FastHeartbeat(declared, coordinator, metrics))
