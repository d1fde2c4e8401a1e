"""The market and its one writer: every change is one transaction under one lock that
journals the market's commands with the rows they touch, and a failed commit rebuilds
the market from the journal. Services hold the desk; none keeps a market of its own."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.client.identity import Unauthenticated
from shoal.coordinator.db.schema import LeaseRow, MarketCommandRow
from shoal.coordinator.db.store import Store
from shoal.coordinator.errors import Conflict, Forbidden, Gone, NotFound
from shoal.coordinator.services import journal
from shoal.market import Clearing, Market, MarketConfig, MarketError
from shoal.spec.errors import SpecError
from shoal.spec.market import DeviceLease, PriceTable

log = logging.getLogger(__name__)


class MarketDesk:
    """The coordinator's market, its clock, and the lock every change takes."""

    def __init__(self, store: Store, prices: PriceTable, config: MarketConfig,
                 clock: Callable[[], float]) -> None:
        self.store, self._clock = store, clock
        self.lock = threading.RLock()  # one writer: the market is not thread-safe
        self._clock_lock = threading.Lock()  # `now_s`'s own
        self.market = Market(prices, config)
        self.fill_status: dict[str, str] = {}  # job -> its fill status at the last round
        self._last_s = 0.0
        self.rebuild()

    def now_s(self) -> float:
        """Wall time that never runs backwards (the market refuses a clock that does).

        Its own small lock, not the desk's: every signed request reads the
        time, and must not wait for a market round to finish.
        """
        with self._clock_lock:
            self._last_s = max(self._last_s, self._clock())
            return self._last_s

    @contextmanager
    def change(self) -> Iterator[Session]:
        """The lock and one transaction; a failed commit rebuilds the market from the store."""
        with self.lock:
            try:
                with self.store.change() as session:
                    yield session
            except (MarketError, SpecError, Conflict, Forbidden, Gone, NotFound, Unauthenticated):
                raise  # refused before anything was applied to the market
            except Exception:
                log.exception("store write failed; rebuilding the market from the journal")
                self.rebuild()
                raise

    def rebuild(self) -> None:
        """The market as the journal's commands, replayed in order, make it."""
        with self.lock, self.store.read() as session:
            self.market = Market(self.market.prices, self.market.config)
            rows = session.scalars(select(MarketCommandRow).order_by(MarketCommandRow.seq))
            count = 0
            for row in rows:
                result = journal.apply(self.market, journal.parsed(row.kind, row.payload),
                                       row.at_s)
                if isinstance(result, Clearing):
                    self.fill_status.update({f.job: f.status.value for f in result.fills})
                self._last_s = max(self._last_s, row.at_s)
                count += 1
            if count:
                log.info("market rebuilt from %d journaled commands", count)

    def command(self, session: Session, command: journal.MarketCommand, at_s: float) -> Any:
        """Carry out `command` on the market and journal it in `session`'s transaction."""
        result = journal.apply(self.market, command, at_s)
        self.record(session, command, at_s)
        return result

    @staticmethod
    def record(session: Session, command: journal.MarketCommand, at_s: float) -> None:
        """Journal a command already carried out (a clearing round that changed something)."""
        kind, payload = journal.stored(command)
        session.add(MarketCommandRow(at_s=at_s, kind=kind, payload=payload))

    def store_leases(self, session: Session, leases: Iterable[DeviceLease]) -> None:
        """The lease rows the API reads, as the market now holds each lease."""
        for lease in leases:
            lease = self.market.book.leases.get(lease.lease, lease)  # the latest ends_at_s
            row = session.get(LeaseRow, lease.lease)
            if row is None:
                row = LeaseRow(lease=lease.lease, job_id=lease.job, offer_id=lease.offer_id,
                               provider=lease.provider, price_wei_per_s=lease.price_wei_per_s,
                               start_s=lease.start_s)
                session.add(row)
            row.ends_at_s, row.value = lease.ends_at_s, lease.model_dump(mode="json")
