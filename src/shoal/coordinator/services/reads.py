"""What the coordinator's API reads, a service it holds: jobs with their bills
by now, agents, offers, providers and the audit log.

The API reads listings a page at a time (`after` the last key seen, at most
`limit` rows): a market of ten thousand agents would otherwise be one answer of
megabytes, built for anyone who asks, as often as they ask."""

from __future__ import annotations

from typing import Any

from collections import defaultdict

from sqlalchemy import and_, or_, select

from shoal.coordinator.errors import NotFound
from shoal.coordinator.services.views import (
    agent_view, event_view, job_view, offer_view,
)
from shoal.coordinator.db.schema import AgentRow, EventRow, JobRow, OfferRow, ParticipantRow
from shoal.coordinator.db.store import Store
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.settings import CoordinatorSettings
from shoal.market import MarketError
from shoal.spec.coordinator import AgentView, Event, JobView, OfferView, ProviderView, Role


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

    def jobs(self, submitter: str | None = None, after: str | None = None,
             limit: int | None = None) -> list[JobView]:
        """Jobs in the order they were submitted: those after job `after`, `limit` at most."""
        with self.desk.lock, self.store.read() as session:
            query = select(JobRow).order_by(JobRow.created_at_s, JobRow.job_id).limit(limit)
            if submitter:
                query = query.where(JobRow.submitter == submitter)
            if after is not None:
                last = session.get(JobRow, after)
                if last is None:
                    raise NotFound(f"no job '{after}' to list after: pass the last job_id "
                                   "of the page before, or no `after` for the first page")
                query = query.where(or_(JobRow.created_at_s > last.created_at_s, and_(
                    JobRow.created_at_s == last.created_at_s, JobRow.job_id > after)))
            now = self.desk.now_s()
            return [job_view(row, self._meter(row.job_id), now) for row in session.scalars(query)]

    def _meter(self, job_id: str) -> Any:
        try:
            return self.desk.market.meter(job_id)
        except MarketError:
            return None

    def agents(self, after: str | None = None, limit: int | None = None) -> list[AgentView]:
        """Agents by id: those after `after`, `limit` at most."""
        now = self.desk.now_s()
        query = select(AgentRow).order_by(AgentRow.agent_id).limit(limit)
        if after is not None:
            query = query.where(AgentRow.agent_id > after)
        with self.store.read() as session:
            return [agent_view(row, now, self.settings.agent_timeout_s)
                    for row in session.scalars(query)]

    def offers(self, after: str | None = None, limit: int | None = None) -> list[OfferView]:
        """Offers by id: those after `after`, `limit` at most."""
        query = select(OfferRow).order_by(OfferRow.offer_id).limit(limit)
        if after is not None:
            query = query.where(OfferRow.offer_id > after)
        with self.store.read() as session:
            return [offer_view(row) for row in session.scalars(query)]

    def providers(self, after: str | None = None, limit: int | None = None) -> list[ProviderView]:
        """Providers by address (those after `after`, `limit` at most), each with its
        agents and offers: read for the page's providers only, and grouped in one pass."""
        now = self.desk.now_s()
        query = select(ParticipantRow).where(ParticipantRow.role == Role.provider.value) \
            .order_by(ParticipantRow.address).limit(limit)
        if after is not None:
            query = query.where(ParticipantRow.address > after)
        with self.store.read() as session:
            page = session.scalars(query).all()
            addresses = [row.address for row in page]
            agents: dict[str, list[AgentView]] = defaultdict(list)
            for row in session.scalars(select(AgentRow).where(AgentRow.provider.in_(addresses))
                                       .order_by(AgentRow.agent_id)):
                agents[row.provider].append(agent_view(row, now, self.settings.agent_timeout_s))
            offers: dict[str, list[OfferView]] = defaultdict(list)
            for row in session.scalars(select(OfferRow).where(OfferRow.provider.in_(addresses))
                                       .order_by(OfferRow.offer_id)):
                offers[row.provider].append(offer_view(row))
            return [ProviderView(address=row.address, name=row.name,
                                 agents=tuple(agents[row.address]),
                                 offers=tuple(offers[row.address])) for row in page]

    def events(self, job_id: str | None = None, after: int = 0, limit: int = 200) -> list[Event]:
        with self.store.read() as session:
            query = select(EventRow).where(EventRow.seq > after).order_by(EventRow.seq).limit(limit)
            if job_id is not None:
                query = query.where(EventRow.job_id == job_id)
            return [event_view(row) for row in session.scalars(query)]
