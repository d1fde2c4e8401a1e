"""What the coordinator's API reads, a service it holds: jobs with their bills
by now, agents, offers and the audit log."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from shoal.coordinator.errors import NotFound
from shoal.coordinator.services.views import (
    agent_view, event_view, job_view, offer_view,
)
from shoal.coordinator.db.schema import AgentRow, EventRow, JobRow, OfferRow
from shoal.coordinator.db.store import Store
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.settings import CoordinatorSettings
from shoal.market import MarketError
from shoal.spec.coordinator import AgentView, Event, JobView, OfferView


class CoordinatorReads:
    """Reads of the store, with the market's meters for the bills of running jobs."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings) -> None:
        self.store, self.desk, self.settings = store, desk, settings

    def job(self, job_id: str) -> JobView:
        with self.desk.lock, self.store.read() as session:
            row = session.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"no job '{job_id}'")
            return job_view(row, self._meter(job_id), self.desk.now_s())

    def jobs(self, submitter: str | None = None) -> list[JobView]:
        with self.desk.lock, self.store.read() as session:
            query = select(JobRow).order_by(JobRow.created_at_s)
            if submitter:
                query = query.where(JobRow.submitter == submitter)
            now = self.desk.now_s()
            return [job_view(row, self._meter(row.job_id), now) for row in session.scalars(query)]

    def _meter(self, job_id: str) -> Any:
        try:
            return self.desk.market.meter(job_id)
        except MarketError:
            return None

    def agents(self) -> list[AgentView]:
        now = self.desk.now_s()
        with self.store.read() as session:
            return [agent_view(row, now, self.settings.agent_timeout_s)
                    for row in session.scalars(select(AgentRow).order_by(AgentRow.agent_id))]

    def offers(self) -> list[OfferView]:
        with self.store.read() as session:
            return [offer_view(row) for row in
                    session.scalars(select(OfferRow).order_by(OfferRow.offer_id))]

    def events(self, job_id: str | None = None, after: int = 0, limit: int = 200) -> list[Event]:
        with self.store.read() as session:
            query = select(EventRow).where(EventRow.seq > after).order_by(EventRow.seq).limit(limit)
            if job_id is not None:
                query = query.where(EventRow.job_id == job_id)
            return [event_view(row) for row in session.scalars(query)]
