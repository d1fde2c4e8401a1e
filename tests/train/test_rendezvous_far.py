"""The rendezvous store across a slow link (namespaced hosts, 2 x 20 ms one way):
a wait for keys that exist is answered, however short the wait asked for (a
store 40 ms away never answers a 5 ms wait, so no epoch ever formed across a
WAN)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.harness import network  # noqa: F401  (the namespaced-hosts fixture)
from tests.harness.netns import Network

# Namespaced hosts behind an emulated slow link (over 5 s on two cores): out of
# `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

CLIENT = """
import json, sys, time
from shoal.train.rendezvous import Rendezvous, connect
rdzv = Rendezvous(connect(sys.argv[1], int(sys.argv[2])))
out = {"round_trip_s": rdzv.round_trip_s()}
start = time.monotonic()
out["waited"] = rdzv.wait_keys(["ready"], 0.005)  # the key exists: the store says so
out["wait_s"] = time.monotonic() - start
out["latest"] = rdzv.latest_epoch()
start = time.monotonic()
out["missing"] = rdzv.wait_keys(["never"], 0.005)
out["missing_s"] = time.monotonic() - start
print(json.dumps(out))
"""

SERVER = """
import sys, time
from shoal.train.rendezvous import connect
store = connect("0.0.0.0", 29411, is_master=True)
store.set("ready", "1")
store.set("epoch/latest", "3")
print("up", flush=True)
time.sleep(60)
"""


def test_waits_and_reads_work_across_a_slow_link(network: Network, tmp_path):
    server_host, client_host = network.add_host("store"), network.add_host("worker")
    server_host.emulate(delay_ms=20.0)
    client_host.emulate(delay_ms=20.0)
    log = tmp_path / "server.log"
    server_host.popen([sys.executable, "-c", SERVER], log=log)
    deadline = time.monotonic() + 20
    while "up" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)
    result = client_host.run([sys.executable, "-c", CLIENT, server_host.address, "29411"],
                             timeout_s=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["waited"] is True and out["latest"] == 3 and out["missing"] is False
    assert out["round_trip_s"] >= 0.080  # two links of 20 ms each way
    # A short wait asks the store at least once, however far it is: a round trip of the link.
    assert out["missing_s"] >= 0.080 and out["wait_s"] >= 0.080
