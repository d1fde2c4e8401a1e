"""The gate in front of a market job's rendezvous store, tried as the parties who
would get past it: a stranger who read the job's endpoint, a member of one lease
showing another lease's name, a token of another job, and a host that is not the
job's (a man in the middle) fishing for a lease's token."""

from __future__ import annotations

import threading
import time

import pytest

from shoal.elastic.gate_keys import GateKeys, lease_identity
from shoal.elastic.job_host import JobHostConfig, _serve
from shoal.elastic.gate import (MAX_HOLD_S, MIN_HOLD_S, GateRefused, StoreGate, StoreTunnel,
                               held_for_s)
from shoal.elastic.store_wire import Query, Request
from shoal.spec.coordinator import RendezvousPass
from shoal.train.rendezvous import HELD_READ, Rendezvous, RendezvousError, connect


SEVEN, EIGHT = "prov-l7-a0-w0", "prov-l8-a0-w0"  # a worker of lease 7, one of lease 8


@pytest.fixture
def gated(tmp_path):
    """A job host's store behind its gate, as the coordinator runs it."""
    config = JobHostConfig(bind="127.0.0.1", port=0, run_dir=tmp_path / "run",
                           gate_dir=tmp_path / "gate")
    server, gate, host = _serve(config)
    yield server, gate, host, GateKeys.load(tmp_path / "gate")
    gate.close()
    server.close()


def endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def test_the_store_listens_on_loopback_and_the_public_endpoint_is_the_gate(gated):
    server, gate, host, keys = gated
    assert host["store"] == f"127.0.0.1:{server.port}"
    assert host["endpoint"] == f"127.0.0.1:{gate.port}" != host["store"]
    assert host["cert_sha256"] == keys.cert_sha256()


def test_a_stranger_with_the_endpoint_cannot_end_the_job(gated):
    """c10d's own client, pointed at the published endpoint, gets no store: what it would
    write (`failed`, which stops every worker) never lands."""
    server, _, host, _ = gated
    with pytest.raises(RendezvousError):
        Rendezvous(connect(*endpoint(host["endpoint"]), timeout_s=1.0)).mark_failed("owned")
    assert server.rdzv.failure() is None and not server.rdzv.done()


def test_a_lease_admitted_reads_and_writes_the_store_through_its_tunnel(gated):
    server, gate, host, keys = gated
    tunnel = StoreTunnel(*endpoint(host["endpoint"]), keys.gate_pass(lease_identity(7)))
    try:
        tunnel.check()
        rdzv = Rendezvous(connect("127.0.0.1", tunnel.port, timeout_s=5.0))
        rdzv.report_speed(SEVEN, 12.5)
        assert rdzv.speeds((SEVEN,)) == [12.5]  # answered after the set: it reached the store
        assert server.rdzv.speeds((SEVEN,)) == [12.5]  # the same store, unchanged on the way
        server.rdzv.request_leave("w1")
        assert rdzv.leaving(["w1", "w2"]) == ["w1"]
    finally:
        tunnel.close()
    assert gate.admitted[lease_identity(7)] >= 2  # the check, and the store's connection


def test_a_read_the_gate_holds_answers_once_its_key_is_set_in_one_round_trip(gated):
    """A step's decision through a market job's gate: one request, answered when the
    authority writes it (the gate waits on the store's loopback), the missing answer after
    the hold; the store untouched by the reads, and the same client's next requests in order."""
    server, gate, host, keys = gated
    tunnel = StoreTunnel(*endpoint(host["endpoint"]), keys.gate_pass(lease_identity(7)))
    try:
        rdzv = Rendezvous(connect("127.0.0.1", tunnel.port, timeout_s=5.0))
        assert rdzv.gate_holds_reads()
        assert not server.rdzv.gate_holds_reads()  # the store itself answers no held read
        before = dict(gate.relayed_kinds)
        started = time.monotonic()
        assert rdzv.read_held("decision/0/0", 0.2) is None  # not written: the hold runs out
        assert 0.15 < time.monotonic() - started < 2.0
        threading.Timer(0.2, lambda: server.rdzv.store.set("decision/0/0", "ruled")).start()
        started = time.monotonic()
        assert rdzv.read_held("decision/0/0", 1.0) == b"ruled"
        assert 0.15 < time.monotonic() - started < 0.9  # as it was set, not at the hold's end
        asked = {k: v - before.get(k, 0) for k, v in gate.relayed_kinds.items()
                 if v > before.get(k, 0)}
        assert asked == {"COMPARE_SET decision": 2}  # no wait, no second read
        assert rdzv.read_held("decision/0/0", 1.0) == b"ruled"  # set: answered at once
        rdzv.report_speed(SEVEN, 3.0)
        assert rdzv.speeds((SEVEN,)) == [3.0]  # the connection's requests still in order
        assert not server.rdzv.store.check(["gate/holds"])
    finally:
        tunnel.close()


@pytest.mark.parametrize("forgery", ["another lease's name", "another job's key", "no token"])
def test_a_token_that_is_not_this_hosts_for_that_identity_is_refused(gated, tmp_path, forgery):
    server, gate, host, keys = gated
    other_job = GateKeys.create_or_load(tmp_path / "other-gate")
    token = {"another lease's name": keys.token(lease_identity(7)),  # shown as lease 8
             "another job's key": other_job.token(lease_identity(8)),
             "no token": "0" * 64}[forgery]
    tunnel = StoreTunnel(*endpoint(host["endpoint"]),
                         RendezvousPass(identity=lease_identity(8), token=token,
                                        cert_sha256=keys.cert_sha256()))
    try:
        with pytest.raises(GateRefused, match="did not admit lease:8"):
            tunnel.check()
        # The store's own client through the tunnel gets nowhere either.
        with pytest.raises(RendezvousError):
            Rendezvous(connect("127.0.0.1", tunnel.port, timeout_s=1.0)).mark_failed("owned")
    finally:
        tunnel.close()
    assert server.rdzv.failure() is None
    assert lease_identity(8) not in gate.admitted


def test_a_host_that_is_not_the_jobs_never_sees_the_leases_token(gated, tmp_path):
    """An impostor gate (another certificate, its own store) in the job host's place: the
    tunnel pins the certificate the coordinator named and hangs up before it shows its
    token, so the impostor can neither replay the token to the real gate nor feed the
    worker a store of its own."""
    server, _, _, keys = gated
    impostor_keys = GateKeys.create_or_load(tmp_path / "impostor")
    impostor = StoreGate("127.0.0.1", 0, ("127.0.0.1", server.port), impostor_keys)
    heard: list[str] = []
    admits = impostor_keys.admits
    object.__setattr__(impostor_keys, "admits",
                       lambda identity, token: heard.append(token) or admits(identity, token))
    tunnel = StoreTunnel("127.0.0.1", impostor.port, keys.gate_pass(lease_identity(7)))
    try:
        with pytest.raises(GateRefused, match="another certificate"):
            tunnel.check()
        with pytest.raises(RendezvousError):
            connect("127.0.0.1", tunnel.port, timeout_s=1.0)
    finally:
        tunnel.close()
        impostor.close()
    assert heard == []  # no token reached it


def test_a_lease_that_ended_is_cut_off_and_kept_out(gated):
    """Lease 7's token is still a valid HMAC once its lease ends (preempted, barred,
    slashed): the coordinator revokes it, the gate closes its open connection within a
    second or two and lets no new one in; lease 8 goes on."""
    server, gate, host, keys = gated
    seven = StoreTunnel(*endpoint(host["endpoint"]), keys.gate_pass(lease_identity(7)))
    eight = StoreTunnel(*endpoint(host["endpoint"]), keys.gate_pass(lease_identity(8)))
    try:
        rdzv = Rendezvous(connect("127.0.0.1", seven.port, timeout_s=5.0))
        other = Rendezvous(connect("127.0.0.1", eight.port, timeout_s=5.0))
        assert rdzv.progress() == 0
        keys.revoke({lease_identity(7)})
        deadline = time.monotonic() + 10
        with pytest.raises((RuntimeError, ValueError)):  # c10d's error on a closed store
            while time.monotonic() < deadline:
                rdzv.report_speed(SEVEN, 99.0)
                rdzv.progress()
                time.sleep(0.1)
        with pytest.raises(GateRefused, match="revoked"):
            seven.check()
        other.report_speed(EIGHT, 5.0)
        assert other.speeds((EIGHT,)) == [5.0]  # the lease still running is not touched
    finally:
        seven.close()
        eight.close()


def test_an_unreadable_list_of_revoked_tokens_keeps_everyone_out(gated):
    """Fail closed: a gate that cannot tell who was revoked admits nobody."""
    _, _, host, keys = gated
    (keys.folder / "revoked.json").write_text("not json")
    tunnel = StoreTunnel(*endpoint(host["endpoint"]), keys.gate_pass(lease_identity(7)))
    try:
        with pytest.raises(GateRefused, match="revoked"):
            tunnel.check()
    finally:
        tunnel.close()


@pytest.mark.parametrize("hello", [b"not json\n", b'{"identity": "lease:7"}\n',
                                   '{"identity": "lease:7", "token": "\u00e9t\u00e9"}\n'.encode(),
                                   b"x" * 70000])
def test_a_malformed_hello_is_closed_and_the_gate_stays_up(gated, hello):
    """Whatever a client sends first, the gate hangs up on it and serves the next one."""
    import socket
    import ssl

    server, gate, host, keys = gated
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(endpoint(host["endpoint"]), timeout=5) as raw, \
            context.wrap_socket(raw) as conn:
        conn.sendall(hello)
        assert b"admitted" not in conn.recv(100)
    tunnel = StoreTunnel(*endpoint(host["endpoint"]), keys.gate_pass(lease_identity(7)))
    try:
        tunnel.check()
    finally:
        tunnel.close()


def test_a_lease_cannot_ask_the_gate_for_holds_outside_its_bounds():
    """A hold of nothing would have the gate reconnect to the store at the lease's pace; a
    hold of hours would keep its connection: both are bounded, and a malformed one is a
    plain read the store answers."""
    def hold(value: bytes) -> float | None:
        return held_for_s(Request(Query.COMPARE_SET, ("/decision/0/0",), (value, value)))

    assert hold(HELD_READ + b"0") == hold(HELD_READ + b"-5") == MIN_HOLD_S
    assert hold(HELD_READ + b"3600000") == MAX_HOLD_S
    assert hold(HELD_READ + b"250") == 0.25
    assert hold(HELD_READ + b"soon") is None and hold(b"\x00shoal:absent") is None
