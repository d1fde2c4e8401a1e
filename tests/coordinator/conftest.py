"""A coordinator on a real store (SQLite, or PostgreSQL from Debian's packages)
behind a real HTTP server on loopback, and signed clients of it."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from eth_account import Account

from shoal.client.http import CoordinatorClient
from shoal.client.tls import CertificatePin
from shoal.coordinator import Coordinator, CoordinatorSettings, create_app
from shoal.coordinator.db.database import open_store_engine
from shoal.coordinator.tls import served_certificate
from shoal.verify.roles.verdicts import sign_verdict
from shoal.spec.audit import SignedVerdictBody, VerdictFiling
from shoal.spec.coordinator import AgentRegistration, Backend, Preflight, Registration
from shoal.spec.proof import Verdict
from tests.conftest import tiny_job_toml
from tests.harness.postgres import postgres_server  # noqa: F401

TINY_JOB = tiny_job_toml(Path("ckpt"), steps=20)  # only ever read, never run, here


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_store_url(request, tmp_path) -> str:
    """An empty store on each engine the coordinator supports (the migrations' tests)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    server = request.getfixturevalue("postgres_server")
    return server.fresh_database(f"t_{time.monotonic_ns()}")


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> Path:
    """A SQLite store migrated to the newest schema, once a session."""
    path = tmp_path_factory.mktemp("migrated") / "store.db"
    open_store_engine(f"sqlite:///{path}").dispose()
    return path


@pytest.fixture(scope="session")
def migrated_postgres(postgres_server) -> str:  # noqa: F811 - the fixture, imported above
    """A PostgreSQL database migrated to the newest schema, once a session; its name."""
    open_store_engine(postgres_server.fresh_database("migrated")).dispose()  # no one left on it
    return "migrated"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """Every store test runs on both engines the coordinator supports, each on a fresh
    store already at the newest schema: a copy of one migrated once a session (running
    the migrations for each of ~220 tests cost ~0.1 s on SQLite, ~0.3 s on PostgreSQL).
    The coordinator finds it current and migrates nothing."""
    if request.param == "sqlite":
        shutil.copyfile(request.getfixturevalue("migrated_sqlite"), tmp_path / "store.db")
        return f"sqlite:///{tmp_path}/store.db"
    server = request.getfixturevalue("postgres_server")
    return server.fresh_database(f"t_{time.monotonic_ns()}",
                                 template=request.getfixturevalue("migrated_postgres"))


@pytest.fixture
def operator():
    return Account.create()


def make_settings(store_url: str, operator=None, **overrides) -> CoordinatorSettings:
    import tempfile

    values = dict(store_url=store_url, audience="shoal-test", heartbeat_s=0.2,
                  data_dir=tempfile.mkdtemp(prefix="shoal-coordinator-"),
                  # 3 s, not less: these tests' agents are clients that never beat, and on
                  # 2 loaded cores a fixture took over 1 s from an agent's registration to
                  # the round that leased it, so the agent was reaped before its lease.
                  agent_timeout_s=3.0, clear_interval_s=0.1, notice_period_s=2.0,
                  forced_error_rate=0.0,  # tests of forced errors turn them on
                  records_grace_s=0.0)  # epochs left behind root at once (test_records_grace)
    if operator is not None:
        values["operators"] = (operator.address,)
    return CoordinatorSettings(**{**values, **overrides})


class Served:
    """A coordinator app served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, coordinator: Coordinator, run_rounds: bool = False) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        # Served as `shoal coordinator` serves it: over TLS where its settings ask for it.
        self.certificate = served_certificate(coordinator.settings)
        self.url = self.url_at(self.port)
        self.app = create_app(coordinator, run_rounds=run_rounds)
        factory = None if self.certificate is None else \
            (lambda _config, _default: self.certificate.context())
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on",
                                ssl_context_factory=factory)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    def url_at(self, port: int) -> str:
        """This coordinator's URL on `port` (another's: a relay's in front of it)."""
        return f"{'http' if self.certificate is None else 'https'}://127.0.0.1:{port}"

    def client(self, account=None) -> CoordinatorClient:
        pin = self.certificate and CertificatePin(self.certificate.sha256)
        return CoordinatorClient(self.url, account, pin=pin)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def served(store_url, operator) -> Iterator[Served]:
    coordinator = Coordinator(make_settings(store_url, operator))
    serving = Served(coordinator)
    yield serving
    serving.stop()
    coordinator.hosts.stop_all()
    coordinator.engine.dispose()


def provider_with_agent(client: CoordinatorClient, agent_id: str = "agent-a",
                        speed: float = 100.0, devices: int = 1, region: str = "eu",
                        torch: str | None = None) -> None:
    client.register(Registration(role="provider", name=f"p-{agent_id}"))
    client.register_agent(AgentRegistration(
        agent_id=agent_id, region=region,
        devices=tuple(Preflight(device_kind="cpu", speed_samples_per_s=speed, memory_gb=4.0,
                                backend=Backend.gloo, collective_ok=True, torch=torch)
                      for _ in range(devices))))


def ruled_on(coordinator: Coordinator, client: CoordinatorClient, job_id: str,
             verdict: Verdict, account) -> str:
    """`verdict`, signed by `account`, filed through `client`: the referee's ruling."""
    signed = sign_verdict(verdict, account)
    (filed,) = client.file_verdicts(job_id, VerdictFiling(verdicts=(SignedVerdictBody(
        verdict=signed.verdict, signature=signed.signature),)))
    coordinator.referee.wait()
    (ruled,) = [v for v in client.verdicts(job_id) if v.seq == filed.seq]
    return ruled.ruling
