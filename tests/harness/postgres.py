"""A real, throwaway PostgreSQL server from Debian's packages, for the store tests:
the coordinator store must behave the same on SQLite and PostgreSQL, and only a
real server shows PostgreSQL's locking, types and errors."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.harness.installs import one_installer

PG_ROOT = Path("/usr/lib/postgresql")
USER = "shoal"
INSTALL_HINT = ("PostgreSQL server binaries not found under /usr/lib/postgresql/<version>/bin; "
                "install them with: apt-get install -y --no-install-recommends postgresql")


def _candidates() -> list[Path]:
    found = [d / "bin" for d in PG_ROOT.glob("*") if d.name.isdigit()
             and all((d / "bin" / b).is_file() for b in ("postgres", "initdb", "pg_ctl"))]
    return sorted(found, key=lambda b: int(b.parent.name), reverse=True)


def find_postgres_bin() -> Path:
    """The newest Debian PostgreSQL bin dir, installing the package if we can."""
    if not _candidates() and os.geteuid() == 0 and shutil.which("apt-get"):
        with one_installer("apt"):
            if not _candidates():  # another test may have, meanwhile
                env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
                install = ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"]
                # A fresh image has no package lists; only then is the slow update worth it.
                if subprocess.run(install, env=env, capture_output=True).returncode != 0:
                    subprocess.run(["apt-get", "update"], env=env, capture_output=True)
                    subprocess.run(install, env=env, capture_output=True)
    if not (found := _candidates()):
        raise RuntimeError(INSTALL_HINT)
    return found[0]


def _free_port() -> int:
    # The OS picks a free port; another process could grab it before postgres
    # binds, which is why start() retries on "address in use".
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class PostgresServer:
    """`with PostgresServer() as pg:` a started server at `pg.url`, gone afterwards."""

    def __init__(self) -> None:
        self.bin = find_postgres_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="shoal-pg-"))
        self.data, self.log = self.dir / "data", self.dir / "server.log"
        self.port = 0
        # PostgreSQL refuses to run as root, so as root we act as Debian's `postgres` user.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            try:
                shutil.chown(self.dir, "postgres", "postgres")
            except LookupError:
                shutil.rmtree(self.dir)
                raise RuntimeError(f"running as root but no `postgres` user; "
                                   f"{INSTALL_HINT}") from None

    def _pg(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        # cwd in our dir: the postgres user may not be able to read the caller's cwd.
        return subprocess.run([*self._as, str(self.bin / tool), *args], cwd=self.dir,
                              capture_output=True, text=True, timeout=120)

    def _check(self, done: subprocess.CompletedProcess, what: str) -> None:
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"{what} failed:\n{done.stdout}{done.stderr}\n{log}")

    def __enter__(self) -> PostgresServer:
        try:
            self._check(self._pg("initdb", "-D", str(self.data), "-U", USER, "--auth=trust",
                                 "-E", "UTF8", "--locale=C", "--no-sync"), "initdb")
            for attempt in range(3):
                self.port = _free_port()
                self.log.unlink(missing_ok=True)  # so the check below reads this attempt only
                # Durability is worthless on a throwaway test server; speed is not.
                opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} "
                        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                        "-c max_connections=200")
                done = self._pg("pg_ctl", "-w", "-t", "60", "-D", str(self.data),
                                "-l", str(self.log), "-o", opts, "start")
                if done.returncode == 0:
                    break
                in_use = "already in use" in self.log.read_text(errors="replace")
                if not in_use or attempt == 2:
                    self._check(done, "pg_ctl start")
            self.url = self.fresh_database(USER)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def fresh_database(self, name: str, template: str | None = None) -> str:
        """Create a database `name`, empty or a copy of the database `template` (which
        nobody may be connected to); its SQLAlchemy URL."""
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(create)
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{name}"

    def __exit__(self, *exc: object) -> None:
        # The pid file, not pg_ctl's exit code: a start that timed out may still be running.
        if (pidfile := self.data / "postmaster.pid").exists():
            pid = pidfile.read_text().split("\n", 1)[0]
            # Nothing in it is worth a clean shutdown; immediate is fastest.
            self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            # pg_ctl returns once the pid file is gone, a moment before the postmaster
            # has exited; wait for that. It is init's child (pg_ctl detached it), so a
            # zombie may show in ps until init reaps it: dead, not a leftover server.
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """One server for the whole session; fails (never skips) if it cannot start."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer):
    """A fresh, empty database per test: CREATE DATABASE is cheap, a server start is not."""
    yield postgres_server.fresh_database(f"t_{uuid.uuid4().hex[:12]}")
