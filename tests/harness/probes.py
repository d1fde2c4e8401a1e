"""Measurements between namespaced hosts, made with real sockets: round-trip
times (a one-byte TCP ping-pong), bulk TCP goodput, and numbered UDP datagrams
(which arrive, in what order). There is no `ping` binary here, and ICMP would
not show what TCP sees. Each probe runs a one-shot server in one host and its
client in the other, both as fresh Python processes."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.harness.netns import Host

ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print("ready", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (d := c.recv(1)):
    c.sendall(d)
"""

ECHO_CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.sendall(b"w"); c.recv(1)  # the first exchange also warms ARP and the bridge's table
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1)
    print((time.perf_counter() - t) * 1000)
"""

SINK = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print("ready", flush=True)
c, _ = s.accept(); n = 0; first = None
while (d := c.recv(1 << 20)):
    first = first or time.perf_counter()
    n += len(d)
print(n, time.perf_counter() - first, flush=True)
"""

SOURCE = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.sendall(b"x" * int(sys.argv[3])); c.close()
"""

DATAGRAM_SINK = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root): a stalled reader drops nothing
s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(float(sys.argv[3])); print("ready", flush=True)
try:
    while (d := s.recv(65536)) != b"end":
        if d != b"warm":
            print(int(d[:8]), flush=True)
except socket.timeout:
    pass
"""

DATAGRAM_SOURCE = """
import os, socket, sys, time
# One CPU: a veth hands each datagram to the backlog of the CPU that sent it, so a
# sender that migrates can have datagrams overtake those left in the other backlog.
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
target, count, size, gap = (sys.argv[1], int(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
# Unnumbered datagrams first, for 1.5 s: ARP has its answer (retried after 1 s if
# the link lost it) before the numbered ones go. Datagrams sent while ARP waits sit
# in a queue that drops its oldest, and the kernel flushes that queue while later
# datagrams already take the resolved path: out of order, before any link.
for _ in range(30):
    s.sendto(b"warm", target); time.sleep(0.05)
for i in range(count):
    s.sendto(b"%08d" % i + b"." * (size - 8), target); time.sleep(gap)
time.sleep(1.0)
for _ in range(20):  # one of them arrives, whatever the loss
    s.sendto(b"end", target); time.sleep(0.01)
"""


def _serve(host: Host, script: str, args: list[str], log: Path, timeout_s: float = 10.0):
    process = host.popen([sys.executable, "-u", "-c", script, *args], log=log)
    deadline = time.monotonic() + timeout_s
    while "ready" not in (log.read_text() if log.exists() else ""):
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"probe server did not start: {log.read_text() if log.exists() else ''}")
        time.sleep(0.02)
    return process


def _client(host: Host, script: str, args: list[str], timeout_s: float) -> str:
    done = host.run([sys.executable, "-c", script, *args], timeout_s=timeout_s)
    if done.returncode != 0:
        raise AssertionError(f"probe client failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def _results(process, log: Path, timeout_s: float) -> list[str]:
    process.wait(timeout=timeout_s)
    return [line for line in log.read_text().splitlines() if line != "ready"]


def round_trips_ms(client: Host, server: Host, count: int = 10, port: int = 7101) -> list[float]:
    """`count` round trips of one byte over one TCP connection (Nagle off), in ms."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "echo.out"
        process = _serve(server, ECHO_SERVER, [server.address, str(port)], log)
        out = _client(client, ECHO_CLIENT, [server.address, str(port), str(count)], timeout_s=60)
        _results(process, log, timeout_s=10)
    return [float(line) for line in out.split()]


def goodput_mbit(sender: Host, receiver: Host, size_bytes: int, port: int = 7102) -> float:
    """Payload Mbit/s of one TCP transfer, from its first byte's arrival to its last's."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "sink.out"
        process = _serve(receiver, SINK, [receiver.address, str(port)], log)
        _client(sender, SOURCE, [receiver.address, str(port), str(size_bytes)], timeout_s=300)
        received, seconds = _results(process, log, timeout_s=300)[-1].split()
    assert int(received) == size_bytes, f"{received} of {size_bytes} bytes arrived"
    return int(received) * 8 / float(seconds) / 1e6


def datagrams(sender: Host, receiver: Host, count: int, size: int = 100, gap_s: float = 0.0005,
              idle_s: float = 10.0, port: int = 7103) -> list[int]:
    """The sequence numbers of `count` UDP datagrams, `gap_s` apart, in the order they arrived
    (the receiver stops at the sender's end marker, or after `idle_s` without one)."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "datagrams.out"
        process = _serve(receiver, DATAGRAM_SINK, [receiver.address, str(port), str(idle_s)], log)
        _client(sender, DATAGRAM_SOURCE, [receiver.address, str(port), str(count), str(size), str(gap_s)],
                timeout_s=count * gap_s + 60)
        return [int(line) for line in _results(process, log, timeout_s=60)]
