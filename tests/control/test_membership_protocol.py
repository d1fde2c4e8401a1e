"""The authority and the commit protocol against a real rendezvous store, in one process."""

from __future__ import annotations

import threading

import pytest

from shoal.spec.elastic import MembershipEpoch
from shoal.control.authority import AuthorityConfig, MembershipAuthority
from shoal.train.commit import Excluded, agree
from shoal.control.launcher import free_port
from shoal.train.rendezvous import Rendezvous, connect


@pytest.fixture
def rdzv():
    store = connect("127.0.0.1", free_port(), is_master=True)
    return Rendezvous(store)


def test_authority_forms_drops_admits_and_reforms(rdzv):
    alive = {"a": True, "b": True, "c": True}
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, stall_deadline_s=0.5),
                                    process_alive=lambda w: alive.get(w))
    rdzv.request_join("a")
    authority.tick(0.0)
    assert authority.epoch == -1  # waits for min_workers
    rdzv.request_join("b")
    authority.tick(0.01)
    assert rdzv.epoch(0).members == ("a", "b") and rdzv.epoch(0).reason == "start"

    alive["b"] = False
    authority.tick(0.02)
    assert rdzv.epoch(1).members == ("a",) and rdzv.epoch(1).reason == "exit:b"

    rdzv.request_join("c")
    authority.tick(0.03)
    assert rdzv.epoch(2).members == ("a", "c") and rdzv.epoch(2).reason == "join"

    rdzv.request_reform(2)
    authority.tick(0.04)
    assert rdzv.epoch(3).members == ("a", "c") and rdzv.epoch(3).reason == "reform"

    rdzv.request_leave("c")
    authority.tick(0.05)
    assert rdzv.epoch(4).members == ("a",) and rdzv.epoch(4).reason == "leave:c"


def test_authority_drops_a_silent_worker(rdzv):
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, stall_deadline_s=0.5,
                                                          heartbeat_check_s=0.0))
    rdzv.request_join("a")
    rdzv.request_join("b")
    authority.tick(0.0)
    for now in (0.2, 0.4, 0.6, 0.8):
        rdzv.heartbeat("a")  # only a keeps beating
        authority.tick(now)
    assert rdzv.latest_epoch() == 1
    assert rdzv.epoch(1).members == ("a",) and rdzv.epoch(1).reason == "stall:b"


def _epoch(number, members):
    return MembershipEpoch(epoch=number, members=members, weights=(1.0,) * len(members))


def _vote_in_threads(rdzv, record, outcomes):
    results = {}

    def vote(rank, ok):
        results[rank] = agree(rdzv, record, rank, 7, ok, poll_s=0.01, weights=lambda: None)

    threads = [threading.Thread(target=vote, args=item) for item in outcomes.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_step_commits_only_if_every_exchange_succeeded(rdzv):
    record = _epoch(0, ("a", "b", "c"))
    rdzv.publish_epoch(record)
    decided = _vote_in_threads(rdzv, record, {0: True, 1: True, 2: True})
    assert all(d.commit for d in decided.values())

    record = _epoch(1, ("a", "b", "c"))
    rdzv.publish_epoch(record)
    decided = _vote_in_threads(rdzv, record, {0: True, 1: False, 2: True})
    assert not any(d.commit for d in decided.values())
    assert rdzv.reform_requested(1)


def test_a_dropped_member_no_longer_blocks_the_decision(rdzv):
    record = _epoch(0, ("a", "b", "c"))
    rdzv.publish_epoch(record)
    timer = threading.Timer(0.1, lambda: rdzv.publish_epoch(_epoch(1, ("a", "b"))))
    timer.start()
    decided = _vote_in_threads(rdzv, record, {0: True, 1: True})  # c never votes
    # The survivors agree to redo the step in the next epoch rather than wait for c.
    assert all(not d.commit and d.next_epoch == 1 for d in decided.values())
    with pytest.raises(Excluded):
        agree(rdzv, _epoch(0, ("a", "b", "c")), 2, 8, True, poll_s=0.01, weights=lambda: None)
