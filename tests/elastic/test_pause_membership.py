"""When every member leaves at once (a paused job: all its leases end together),
one of them stays for one more step boundary to write the checkpoint, so the
state does not leave with nobody; joiners later form a fresh epoch."""

from __future__ import annotations

import pytest

from shoal.elastic.authority import AuthorityConfig, MembershipAuthority
from shoal.elastic.liveness import LivenessConfig
from shoal.elastic.serve import RendezvousServer

FAST = LivenessConfig(floor_s=0.5, initial_s=0.5)


@pytest.fixture
def rdzv():
    server = RendezvousServer("127.0.0.1")
    yield server.rdzv
    server.close()


def test_all_leaving_at_once_keeps_one_to_write_the_state(rdzv):
    alive = {"a": True, "b": True}
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, liveness=FAST),
                                    process_alive=lambda w: alive.get(w))
    rdzv.request_join("a")
    rdzv.request_join("b")
    authority.tick(0.0)
    rdzv.request_leave("a")
    rdzv.request_leave("b")
    authority.tick(0.1)
    kept = rdzv.epoch(1)
    assert kept.members == ("a",) and kept.reason == "leave:b,holds-state:a"  # a stays, alone, one more step

    rdzv.request_leave("a")  # a wrote the checkpoint and leaves again: still the last holder
    authority.tick(0.2)
    assert rdzv.latest_epoch() == 1
    alive["a"] = False  # its process is gone: now nobody is left, and the authority waits
    rdzv.report_exit("a")
    authority.tick(0.3)
    assert rdzv.latest_epoch() == 1 and authority.members == ()

    rdzv.request_join("c")
    rdzv.request_join("d")
    authority.tick(0.4)
    authority.tick(0.6)
    fresh = rdzv.epoch(2)
    assert fresh.members == ("c", "d") and fresh.reason == "join"


def test_a_leaver_is_not_kept_while_others_stay(rdzv):
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, liveness=FAST))
    rdzv.request_join("a")
    rdzv.request_join("b")
    authority.tick(0.0)
    rdzv.request_leave("a")
    authority.tick(0.1)
    assert rdzv.epoch(1).members == ("b",) and rdzv.epoch(1).reason == "leave:a"


def test_joiners_arriving_as_the_last_member_leaves_take_its_state_first(rdzv):
    """One member lost, the other leaving (its provider dropped), a replacement waiting:
    the leaver forms the next epoch with the replacement (which takes its live state)
    and only then goes; the replacement never starts an epoch alone, without state."""
    alive = {"a": True, "b": True, "c": True}
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, liveness=FAST),
                                    process_alive=lambda w: alive.get(w))
    rdzv.request_join("a")
    rdzv.request_join("b")
    authority.tick(0.0)
    alive["b"] = False
    rdzv.report_exit("b")
    rdzv.request_leave("a")
    rdzv.request_join("c")
    authority.tick(0.1)
    authority.tick(0.1 + authority.config.join_batch_s)
    handover = rdzv.epoch(rdzv.latest_epoch())
    assert handover.members == ("a", "c"), handover  # a holds the state, c takes it
    rdzv.request_leave("a")  # after a step together, a leaves again
    authority.tick(1.0)
    after = rdzv.epoch(rdzv.latest_epoch())
    assert after.members == ("c",) and "leave:a" in after.reason
