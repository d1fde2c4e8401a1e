"""The one place the coordinator opens ORM sessions: a read, or a change that
commits on leaving. Services hold a `Store` and never build a session themselves."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import EventRow
from shoal.spec.events import AuditEvent


class Store:
    """Sessions on the coordinator's engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reading; anything it adds is dropped unless it commits itself."""
        with Session(self.engine) as session:
            yield session

    @contextmanager
    def change(self) -> Iterator[Session]:
        """One transaction, committed on leaving and rolled back on an error. Rows stay
        loaded after the commit, so a caller may build its answer from them."""
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session


def record_event(session: Session, at_s: float, actor: str, event: AuditEvent,
                 job_id: str | None = None) -> None:
    """An auditable event, written in the transaction of the change it records."""
    session.add(EventRow(at_s=at_s, actor=actor, kind=event.kind.value, job_id=job_id,
                         detail=event.detail()))
