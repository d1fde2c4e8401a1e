"""The namespaced-hosts harness does what the multi-host tests rely on: hosts
reach each other by their own addresses, a partition drops packets silently
(a connection attempt times out; it is never refused), healing restores the
path, degrading a link delays its packets, killing a host leaves no process in
it, and nothing outlives the test."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.harness.netns import HarnessUnsupported
from tests.harness.probes import round_trips_ms

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7000)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b"hi"); c.close()
"""

CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2]))
    print(c.recv(2).decode())
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
"""


def ask(host, address: str, timeout_s: float = 2.0) -> str:
    return host.run([sys.executable, "-c", CLIENT, address, str(timeout_s)], timeout_s=timeout_s + 5).stdout.strip()


def test_hosts_partition_heal_and_die(network):
    a, b = network.add_host("a"), network.add_host("b")
    assert a.address != b.address and a.address.startswith("10.231.")
    a.popen([sys.executable, "-c", SERVER, a.address])
    deadline = time.monotonic() + 10
    while ask(b, a.address) != "hi" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ask(b, a.address) == "hi"

    a.partition()
    assert ask(b, a.address, timeout_s=1.0) == "timeout"  # dropped, not refused
    a.heal()
    assert ask(b, a.address) == "hi"

    assert a.pids()
    a.kill()
    assert a.pids() == []
    assert ask(b, a.address, timeout_s=1.0) in ("refused", "timeout")


def test_degrade_delays_both_ways_of_a_link(network):
    """tc netem where the kernel has it, the userspace emulator where it has not (this
    one): either way each packet waits 50 ms on its way out of a and on its way in."""
    a, b = network.add_host("a"), network.add_host("b")
    try:
        a.degrade(delay_ms=50)
    except HarnessUnsupported as reason:  # neither netem nor /dev/net/tun
        pytest.skip(str(reason))
    assert min(round_trips_ms(b, a, count=5)) >= 100.0
    a.restore()
    assert min(round_trips_ms(b, a, count=5)) < 50.0  # coarse: restored, nothing near 100 ms is added


def test_cleanup_leaves_nothing(network):
    network.add_host("a")
    network.close()
    assert network.leftovers() == []
    assert subprocess.run(["ip", "link", "show", network.bridge], capture_output=True).returncode != 0
