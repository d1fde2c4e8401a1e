"""Attacks on the probe's few slots (issue 40, point 10): keys that ask for probes
again and again, joining none, must not keep a new provider's agent from its probe.
The probes here are the coordinator's real ones (a store on a port, a thread each)
with rank 0's measurement stood in for by one the test ends, on a clock it moves."""

from __future__ import annotations

import threading

import pytest

from shoal.coordinator.errors import Conflict
from shoal.coordinator.services.probe import MAX_FAILED, RECENT_S, NetworkProbes
from shoal.elastic.link_probe import LinkFigures


class Stand:
    """Rank 0's side of each probe: held until the test lets it end, joined or not."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.release = threading.Event()
        self.joined = True

    def measure(self, bind, store, plan) -> LinkFigures:  # noqa: ANN001
        self.release.wait(30)
        if self.joined:
            return LinkFigures(collective_ok=True, rtt_ms=0.2, bandwidth_gbps=1.0)
        return LinkFigures.failed("the agent did not join by the deadline")


@pytest.fixture
def stand():
    return Stand()


@pytest.fixture
def probes(stand):
    probes = NetworkProbes("127.0.0.1", 1.0, lambda: stand.now_s, measure=stand.measure)
    yield probes
    stand.release.set()
    for thread in probes.running():
        thread.join(timeout=30)


def end_all(probes: NetworkProbes, stand: Stand) -> None:
    stand.release.set()
    for thread in probes.running():
        thread.join(timeout=30)
    stand.release.clear()


ATTACKERS = [(f"0xA{i}", f"10.0.0.{i}") for i in range(4)]  # keys, each on its own host


def test_keys_asking_again_and_again_cannot_keep_a_new_agent_from_its_probe(probes, stand):
    stand.joined = False  # the attackers join nothing
    for key, host in ATTACKERS:  # round one: they take every slot
        probes.open(key, "agent-x", host)
    with pytest.raises(Conflict):  # a full house turns anyone away, for a probe's deadline
        probes.open("0xHonest", "agent-h", "10.0.1.1")

    end_all(probes, stand)  # their probes end unjoined; at once, they ask again
    held = []
    for key, host in ATTACKERS:
        try:
            probes.open(key, "agent-x", host)
            held.append(key)
        except Conflict as refused:
            assert "not probed lately" in str(refused)
    assert len(held) == probes.max_open - probes.reserved_for_new

    # The new agent's probe opens beside them, and its figures are on record.
    stand.joined = True
    probes.open("0xHonest", "agent-h", "10.0.1.1")
    end_all(probes, stand)
    outcome = probes.outcome("0xHonest", "agent-h")
    assert outcome is not None and outcome.figures.collective_ok


def test_new_keys_on_a_host_that_had_a_probe_lately_count_as_asking_again(probes, stand):
    """Fresh keys cost nothing; the address they ask from is counted with them."""
    for i in range(probes.max_open):
        try:
            probes.open(f"0xS{i}", f"agent-{i}", "10.0.0.9")
        except Conflict:
            break
    assert probes.open_count() == probes.max_open - probes.reserved_for_new
    probes.open("0xHonest", "agent-h", "10.0.1.1")  # a new host still finds a slot


def test_a_key_whose_probes_keep_failing_is_refused_until_the_window_passes(probes, stand):
    stand.joined = False
    for _ in range(MAX_FAILED):
        probes.open("0xM", "agent-m", "10.0.0.1")
        end_all(probes, stand)
    with pytest.raises(Conflict) as refused:
        probes.open("0xM", "agent-m", "10.0.0.1")
    assert f"{MAX_FAILED} of your probes failed" in str(refused.value) \
        and "firewall" in str(refused.value)
    assert probes.open_count() == 0
    stand.now_s += RECENT_S + 1  # the window passes: one more try, held to the same rule
    stand.joined = True
    probes.open("0xM", "agent-m", "10.0.0.1")
    end_all(probes, stand)
    assert probes.outcome("0xM", "agent-m").figures.collective_ok
