"""Open the coordinator's store: an engine on SQLite (default) or PostgreSQL,
migrated to the current schema before anyone uses it."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from pathlib import Path
from weakref import WeakKeyDictionary, ref

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError

from shoal.coordinator.db.errors import StoreError

MIGRATIONS = Path(__file__).with_name("migrations")
# SQLite engines' writer locks (see `write_transaction`); PostgreSQL engines have none.
_WRITERS: WeakKeyDictionary[Engine, threading.Lock] = WeakKeyDictionary()
SQLITE_POOL = 48  # connections: one per API worker thread (anyio's 40) and the rounds, kept open


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # noqa: ANN001
    cursor = dbapi_connection.cursor()
    # WAL lets readers run beside the one writer; NORMAL sync is safe under WAL
    # (a power cut may lose the last commits, never corrupt); the busy timeout
    # makes a second writer wait instead of failing.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def open_engine(url: str) -> Engine:
    """An engine for `url`; sqlite:///PATH and postgresql+psycopg://... are supported."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"store URL {url!r} is not a database URL: use sqlite:///PATH "
                         "or postgresql+psycopg://USER@HOST:PORT/DB") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        # A pool smaller than the API's worker threads closes and reopens
        # connections under load, and each reopening runs the pragmas again.
        pool = {"pool_size": SQLITE_POOL, "max_overflow": 8} if parsed.database not in (
            None, "", ":memory:") else {}
        engine = create_engine(parsed, connect_args={"check_same_thread": False}, **pool)
        event.listen(engine, "connect", _sqlite_pragmas)
        _WRITERS[engine] = threading.Lock()
        return engine
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, pool_size=10, max_overflow=20, pool_pre_ping=True)
    raise StoreError(f"store URL {url!r}: only SQLite and PostgreSQL stores are supported")


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """One short write transaction, committed on leaving, rolled back on an error.

    SQLite lets one writer in at a time and makes the others sleep and retry
    (1, 2, 5, ... 100 ms) until it is free: under a thousand writes a second
    that sleeping is the latency. This process's writers queue on a lock
    instead and go in the moment it is free. PostgreSQL locks rows, not the
    database, so its writers go straight in.
    """
    with _WRITERS.get(engine) or nullcontext(), engine.begin() as connection:
        yield connection


class GroupCommit:
    """Many small writes from many callers, committed together: each caller's
    future resolves only once the transaction holding its write has committed.

    A thousand heartbeats a second are a thousand tiny transactions, and on
    one machine the per-transaction cost (begin, the writer lock, commit,
    SQLAlchemy's bookkeeping, the hand-over between threads) outweighs the
    statements. Here one thread takes the first write, lingers `linger_s`
    for more (and takes whatever queued while the previous batch committed),
    and runs `run_batch` over them in one write transaction: a few
    milliseconds of latency buy a batch several beats deep at a thousand
    beats a second. The thread ends when idle for `idle_s` and is started
    again by the next `submit`.
    """

    def __init__(self, engine: Engine, run_batch: Callable[[Connection, Sequence], list],
                 linger_s: float = 0.004, max_batch: int = 256, idle_s: float = 2.0) -> None:
        self._engine, self.run_batch = ref(engine), run_batch  # weak: an engine keyed to it can go
        self.linger_s, self.max_batch, self.idle_s = linger_s, max_batch, idle_s
        self._queue: queue.SimpleQueue[tuple[object, Future]] = queue.SimpleQueue()
        self._running = False
        self._guard = threading.Lock()

    def submit(self, item: object) -> Future:
        """A future of `run_batch`'s result for `item`, set after its batch committed."""
        future: Future = Future()
        with self._guard:
            self._queue.put((item, future))
            if not self._running:
                self._running = True
                threading.Thread(target=self._serve, name="store-group-commit", daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            try:
                batch = [self._queue.get(timeout=self.idle_s)]
            except queue.Empty:
                with self._guard:
                    if self._queue.empty():
                        self._running = False
                        return
                continue
            until = time.monotonic() + self.linger_s
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, until - time.monotonic())))
                except queue.Empty:
                    break
            # A caller that gave up (a cancelled request) is dropped before its write is made.
            batch = [(item, future) for item, future in batch if future.set_running_or_notify_cancel()]
            if batch:
                self._commit(batch)

    def _commit(self, batch: list[tuple[object, Future]], retry: bool = True) -> None:
        items, engine = [item for item, _ in batch], self._engine()
        try:
            if engine is None:
                raise StoreError("the store was closed")
            with write_transaction(engine) as connection:
                results = self.run_batch(connection, items)
        except IntegrityError:
            if retry:  # a write of another process raced ours: again, one at a time
                for one in batch:
                    self._commit([one], retry=False)
                return
            batch[0][1].set_exception(StoreError("a write of this request conflicted; retry it"))
            return
        except Exception as error:  # noqa: BLE001 - handed to every caller waiting on this batch
            for _, future in batch:
                future.set_exception(error)
            return
        for (_, future), result in zip(batch, results, strict=True):
            future.set_result(result)


def migrate(engine: Engine, revision: str = "head", down: bool = False) -> None:
    """Bring the schema up (or `down`) to `revision`; a store already there is left as it is."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            (command.downgrade if down else command.upgrade)(config, revision)
    except OperationalError as error:
        raise StoreError(f"cannot reach the store at {engine.url.render_as_string()}: "
                         f"{error.orig}; is the database running and the URL right?") from None


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def open_store_engine(url: str) -> Engine:
    engine = open_engine(url)
    migrate(engine)
    return engine
