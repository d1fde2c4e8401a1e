"""Prometheus metrics of one coordinator, on a registry of its own (so that
several coordinators in one process, as in tests, do not share counters)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shoal.spec.coordinator import JobStatus


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Histogram("shoal_http_request_seconds", "HTTP requests by route",
                                  ["method", "route", "status"], registry=r,
                                  buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        self.refused = Counter("shoal_requests_refused_total",
                               "Requests refused before changing anything", ["reason"], registry=r)
        self.heartbeats = Counter("shoal_agent_heartbeats_total", "Agent heartbeats taken",
                                  registry=r)
        self.rounds = Counter("shoal_market_rounds_total", "Market clearing rounds", registry=r)
        self.leases = Counter("shoal_leases_opened_total", "Device leases opened", registry=r)
        self.notices = Counter("shoal_preemption_notices_total", "Spot leases preempted",
                               registry=r)
        self.lost_agents = Counter("shoal_agents_lost_total",
                                   "Agents silent past the timeout (their leases replaced)",
                                   registry=r)

    def add_state(self, collector: Collector) -> None:
        """Gauges read from the store at scrape time (jobs, workers, spend)."""
        self.registry.register(collector)


class TimedRequests:
    """ASGI middleware: each request's time into `shoal_http_request_seconds`, by
    method, route template (`unmatched` when none) and status.

    Plain ASGI rather than `@app.middleware("http")`, whose request and
    response wrapping cost more than a heartbeat's own work.
    """

    def __init__(self, app: ASGIApp, metrics: CoordinatorMetrics) -> None:
        self.app, self.requests = app, metrics.requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500  # 500: the app raised before answering

        async def noted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noted)
        finally:
            route = scope.get("route")  # set by the router on this same scope
            self.requests.labels(scope["method"], getattr(route, "path", "unmatched"),
                                 str(status)).observe(time.perf_counter() - start)


def state_gauges(coordinator) -> Collector:  # noqa: ANN001 - a Coordinator; avoids an import cycle
    from prometheus_client.core import GaugeMetricFamily

    class _State(Collector):
        def collect(self):  # noqa: ANN202
            jobs = coordinator.reads.jobs()
            by_status = GaugeMetricFamily("shoal_jobs", "Jobs by status", labels=["status"])
            for status in JobStatus:
                by_status.add_metric([status.value], sum(j.status is status for j in jobs))
            yield by_status
            agents = coordinator.reads.agents()
            yield GaugeMetricFamily("shoal_agents_online", "Agents heard from within the timeout",
                                    value=sum(a.online for a in agents))
            now = coordinator.desk.now_s()
            workers = sum(1 for j in jobs for lease in j.leases
                          if lease.start_s <= now and (lease.ends_at_s is None or lease.ends_at_s > now))
            yield GaugeMetricFamily("shoal_workers_leased", "Devices leased right now", value=workers)
            yield GaugeMetricFamily("shoal_spend_wei", "Wei billed to all jobs so far",
                                    value=float(sum(j.spent_wei for j in jobs)))

    return _State()


__all__ = ["CoordinatorMetrics", "Gauge", "TimedRequests", "state_gauges"]
