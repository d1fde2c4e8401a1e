"""Test harnesses that make faults real: hosts as network namespaces
(`netns`) and multi-host shoal jobs run through them (`hosts_job`)."""

from __future__ import annotations

import os

import pytest

from tests.harness.netns import HarnessUnavailable, Network, ensure_tools


@pytest.fixture
def network():
    """A private network of namespaced hosts; every trace of it is gone after the test.

    Skips when this machine cannot make namespaces, unless SHOAL_REQUIRE_NETNS=1
    (CI), where that is a failure instead.
    """
    try:
        ensure_tools()
    except HarnessUnavailable as reason:
        if os.environ.get("SHOAL_REQUIRE_NETNS") == "1":
            pytest.fail(f"SHOAL_REQUIRE_NETNS=1 but {reason}")
        pytest.skip(str(reason))
    net = Network()
    try:
        yield net
    finally:
        net.close()
        assert not net.leftovers(), f"namespaces or links left behind: {net.leftovers()}"
