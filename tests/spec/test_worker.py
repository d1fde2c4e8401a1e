"""A worker's name parsed into its identity: what is paid, slashed or judged is the
lease the whole name carries, and no name can be made to read as another lease's."""

import pytest

from shoal.spec.worker import WorkerId, WorkerIdError


def test_a_worker_names_its_lease_however_its_node_name_was_claimed():
    assert WorkerId.parse("agent-a-l12-a0-w0") == WorkerId("agent-a", 12, 0, None, 0)
    assert WorkerId.parse("agent-a-l12-a1.2-w3").lease == 12  # a node name claimed twice
    assert WorkerId.leased("agent-a-l12") is None and WorkerId.leased("w0") is None


@pytest.mark.parametrize("name", ["agent-a-l12-a0-w0", "agent-a-l12-a1.2-w3", "a.b_c-l0-a7-w15",
                                  "x-l55-a0-w0-l7-a0-w0"])
def test_a_name_and_its_identity_round_trip(name):
    assert str(WorkerId.parse(name)) == name


def test_a_name_dressed_as_another_lease_is_what_its_end_says():
    """An agent whose id reads like a worker of lease 55 runs lease 7: its worker is
    lease 7's, never 55's (a parse from the left would hand it lease 55)."""
    named = WorkerId.parse("x-l55-a0-w0-l7-a0-w0")
    assert (named.agent, named.lease, named.attempt, named.index) == ("x-l55-a0-w0", 7, 0, 0)


@pytest.mark.parametrize("name", [
    "a-l7-a0-w0-w1",  # a suffix after the worker index
    "a-l7-a0-w0.1",
    "a-l7-a0.1.2-w0",  # two claims
    "a-l07-a0-w0",  # a leading zero: another spelling of lease 7's worker
    "a-l7-a00-w0",
    "../a-l7-a0-w0",  # path characters in the agent
    "a/b-l7-a0-w0",
    "a-l7-a0-w0\n",
    "-l7-a0-w0",  # no agent
    "a-l-7-a0-w0",
    "a-l7-a0-w0 ",
    "a" * 65 + "-l7-a0-w0",  # an agent id longer than any the coordinator registers
    "w0", "agent-a-l12", "",
])
def test_a_name_that_is_no_lease_workers_is_refused(name):
    with pytest.raises(WorkerIdError, match="not a market lease's worker"):
        WorkerId.parse(name)
    assert WorkerId.leased(name) is None
