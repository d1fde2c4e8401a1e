"""Issue 40, point 9, the coordinator's side: a stranger on the path between an agent and
its coordinator (here a TCP relay on loopback) reads the gate tokens in heartbeat replies
and rewrites them, over plain HTTP. Over TLS, with the agent pinning the coordinator's
certificate, the relay sees only ciphertext, and a relay that shows its own certificate
is refused before a byte of a request leaves the agent."""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from eth_account import Account

from shoal.client.http import CoordinatorClient
from shoal.client.tls import CertificatePin
from shoal.coordinator import Coordinator
from shoal.elastic.gate_keys import GateKeys
from shoal.errors import ControlError
from shoal.spec.coordinator import Heartbeat, HeartbeatReply, OfferTerms
from tests.coordinator.conftest import Served, make_settings, provider_with_agent
from tests.coordinator.test_attendance import PRICE, offers_and_a_job

TOKEN = re.compile(rb'"token":"([0-9a-f]{64})"')


class Relay:
    """A stranger on the path: forwards each connection to `upstream`, keeps every byte it
    sees, and passes the coordinator's answers through `rewrite` on their way back. With
    `posing`, it ends TLS itself with its own certificate (a man in the middle) and opens
    its own TLS to the coordinator, so what it keeps is the plaintext."""

    def __init__(self, upstream: tuple[str, int], rewrite: Callable[[bytes], bytes] = bytes,
                 posing: GateKeys | None = None) -> None:
        self.upstream, self.rewrite, self.posing = upstream, rewrite, posing
        self.seen = bytearray()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                agent, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(agent,), daemon=True).start()

    def _carry(self, agent: socket.socket) -> None:
        coordinator = socket.create_connection(self.upstream)
        try:
            if self.posing is not None:
                agent = self.posing.server_context().wrap_socket(agent, server_side=True)
                towards = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                towards.check_hostname, towards.verify_mode = False, ssl.CERT_NONE
                coordinator = towards.wrap_socket(coordinator)
        except (OSError, ssl.SSLError):  # the agent hung up on our certificate
            agent.close(), coordinator.close()
            return
        threading.Thread(target=self._pump, args=(coordinator, agent, self.rewrite),
                         daemon=True).start()
        self._pump(agent, coordinator, bytes)

    def _pump(self, source: socket.socket, sink: socket.socket,
              rewrite: Callable[[bytes], bytes]) -> None:
        try:
            while chunk := source.recv(65536):
                self.seen += chunk
                sink.sendall(rewrite(chunk))
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


def forged_token(chunk: bytes) -> bytes:
    """The stranger's rewrite: every gate token in an answer becomes its own."""
    return TOKEN.sub(b'"token":"' + b"e" * 64 + b'"', chunk)


def serving(tmp_path, **tls) -> Iterator[Served]:
    operator = Account.create()
    coordinator = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db", operator,
                                            data_dir=tmp_path / "coordinator", **tls))
    served = Served(coordinator)
    yield served
    served.stop()
    coordinator.hosts.stop_all()
    coordinator.engine.dispose()


@pytest.fixture
def plain(tmp_path):
    yield from serving(tmp_path)


@pytest.fixture
def tls(tmp_path):
    yield from serving(tmp_path, tls_self_signed=True)


def leased_agent(served: Served) -> Account:
    """Agent `a` holds a lease of a job whose host serves behind its gate: `a`'s heartbeat
    replies carry the lease's gate token from now on. `a`'s provider's key."""
    account = Account.create()
    offers_and_a_job(served, {"a": PRICE, "b": PRICE}, accounts={"a": account})
    deadline = time.monotonic() + 120  # the job's host imports torch before it serves
    while time.monotonic() < deadline:
        served.app.state.rounds.once()
        if any(a.rendezvous_pass for a in served.client(account).heartbeat(
                "a", Heartbeat()).assignments):
            return account
        time.sleep(0.5)
    raise AssertionError("the job's host did not serve within 120 s")


def gate_tokens(reply: HeartbeatReply) -> set[str]:
    return {a.rendezvous_pass.token for a in reply.assignments if a.rendezvous_pass}


@pytest.mark.slow
def test_over_plain_http_a_stranger_reads_the_gate_token_and_rewrites_it(plain):
    account = leased_agent(plain)
    relay = Relay(("127.0.0.1", plain.port), rewrite=forged_token)
    try:
        via_relay = CoordinatorClient(plain.url_at(relay.port), account)
        (token,) = gate_tokens(via_relay.heartbeat("a", Heartbeat()))
        (real,) = gate_tokens(plain.client(account).heartbeat("a", Heartbeat()))
    finally:
        relay.close()
    assert real.encode() in relay.seen  # read on the way
    assert token == "e" * 64 != real  # and the agent took the stranger's token for the real one


@pytest.mark.slow
def test_over_tls_with_a_pinned_certificate_the_stranger_sees_only_ciphertext(tls):
    account = leased_agent(tls)
    relay = Relay(("127.0.0.1", tls.port), rewrite=forged_token)
    pin = CertificatePin(tls.certificate.sha256)
    try:
        via_relay = CoordinatorClient(tls.url_at(relay.port), account, pin=pin)
        (token,) = gate_tokens(via_relay.heartbeat("a", Heartbeat()))
        provider_with_agent(via_relay, "a2")  # signed requests go through too
    finally:
        relay.close()
    assert token != "e" * 64 and token.encode() not in relay.seen
    assert relay.seen and b"heartbeat" not in relay.seen and b"assignments" not in relay.seen


def test_a_stranger_showing_its_own_certificate_is_refused_before_anything_is_sent(
        tls, tmp_path):
    relay = Relay(("127.0.0.1", tls.port), posing=GateKeys.create_or_load(tmp_path / "mallory"))
    agent = Account.create()
    try:
        pinned = CoordinatorClient(tls.url_at(relay.port), agent,
                                   pin=CertificatePin(tls.certificate.sha256))
        with pytest.raises(ControlError, match="shows a certificate with SHA-256 .* not the "
                                               "pinned .*nothing was sent"):
            pinned.post_offer(OfferTerms(offer_id="a-d0", agent_id="a", price_wei_per_s=PRICE))
        # Nor does a client with no pin take a self-signed certificate: it says what to do.
        unpinned = CoordinatorClient(tls.url_at(relay.port), agent)
        with pytest.raises(ControlError, match="--coordinator-cert-sha256"):
            unpinned.providers()
    finally:
        relay.close()
    assert relay.seen == b""  # not one byte of a request reached the stranger in the clear


def test_the_pinned_client_reaches_the_real_coordinator(tls):
    with tls.client() as client:  # closed: an open keep-alive holds the server's stop 10 s
        assert client.providers() == []
    with pytest.raises(ControlError, match="https://"):
        CoordinatorClient(tls.url.replace("https", "http"), pin=CertificatePin("a" * 64))
