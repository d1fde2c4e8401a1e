"""The coordinator's HTTP API (FastAPI; its OpenAPI description at /openapi.json).

Routes only translate: a verified signer and a validated body in, a view
out. The service decides; its errors become 4xx here (errors.py) and nowhere
else. This module builds the app; each resource's routes have a module of their own.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from shoal import __version__
from shoal.coordinator.api import (
    agents, bundles, checkpoints, disputes, events, health, jobs, participants, probe, progress, proofs,
)
from shoal.coordinator.api.errors import PROBLEMS, answer_errors
from shoal.coordinator.api.fast_heartbeat import serve_heartbeats_fast
from shoal.coordinator.api.limits import limit_bodies
from shoal.coordinator.api.metrics import CoordinatorMetrics, TimedRequests, state_gauges
from shoal.coordinator.api.quota_gate import limit_addresses
from shoal.coordinator.dashboard.routes import dashboard_routes
from shoal.coordinator.service import Coordinator
from shoal.coordinator.rounds import RoundLoop

ROUTERS: tuple[APIRouter, ...] = (
    health.router, participants.router, agents.router, jobs.router, events.router,
    progress.router, proofs.router, disputes.router, probe.router, checkpoints.router, bundles.router,
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
    # Routes read their coordinator, metrics and round loop from here, never from where
    # they were built: one build of the routers serves every app this process makes.
    app.state.coordinator, app.state.metrics, app.state.rounds = coordinator, metrics, rounds
    limit_bodies(app, coordinator, metrics)
    limit_addresses(app, coordinator.quotas, metrics)  # outside the body cap: counted first
    answer_errors(app, metrics)
    app.add_middleware(TimedRequests, metrics=metrics)
    for router in ROUTERS:
        include_as_built(app, router)
    if coordinator.settings.dashboard:
        dashboard_routes(app)
    serve_heartbeats_fast(app, agents.HEARTBEAT, coordinator, metrics)
    return app


def include_as_built(app: FastAPI, router: APIRouter) -> None:
    """`router`'s routes, the very ones built when its module was imported, into `app`.

    Not `app.include_router`: in FastAPI 0.163 it adds a lazy wrapper that
    builds each route's handler again for every app and is walked on every
    request, and `app.routes` then lists wrappers instead of routes. These
    routes read what they serve from the app's state, so one build serves all.
    """
    app.router.routes.extend(router.routes)
