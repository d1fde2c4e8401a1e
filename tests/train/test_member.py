"""A worker's view of its membership against a real rendezvous store: when a newer epoch
makes the step in flight moot."""

from __future__ import annotations

import time

import pytest

from shoal.elastic.serve import RendezvousServer
from shoal.spec.elastic import MembershipEpoch
from shoal.train.member import Membership
from shoal.train.run_config import RunConfig, RunSettings

TIMEOUT_S = 0.3


class NoProgress:
    def waiting(self) -> None:
        pass


@pytest.fixture
def server():
    server = RendezvousServer("127.0.0.1")
    yield server
    server.close()


def member_a(server) -> Membership:
    config = RunConfig(worker="a", host="127.0.0.1", port=server.port,
                       settings=RunSettings(collective_timeout_s=TIMEOUT_S))
    membership = Membership(config, server.rdzv, NoProgress())
    membership.record = MembershipEpoch(epoch=0, members=("a", "b"), weights=(0.5, 0.5),
                                        reason="start")
    return membership


WITHOUT_B = MembershipEpoch(epoch=1, members=("a",), weights=(1.0,), reason="leave:b")


def test_a_member_dropped_without_notice_is_lost_at_once(server):
    assert member_a(server).lost_member(WITHOUT_B)


def test_a_leaver_whose_process_exited_before_voting_is_lost_at_once(server):
    server.rdzv.request_leave("b")
    server.rdzv.report_exit("b")
    assert member_a(server).lost_member(WITHOUT_B)


def test_a_leaver_is_waited_for_then_lost_if_it_never_finishes_its_step(server):
    """b gave notice, so a waits for its last vote; b never casts it (its lease ended and
    the gate cut its connections): a must not wait forever."""
    server.rdzv.request_leave("b")
    membership = member_a(server)
    assert not membership.lost_member(WITHOUT_B)  # it still votes on the step in flight
    time.sleep(TIMEOUT_S / 2)
    assert not membership.lost_member(WITHOUT_B)
    time.sleep(TIMEOUT_S)
    assert membership.lost_member(WITHOUT_B)


def test_a_member_that_stays_is_never_lost(server):
    same = MembershipEpoch(epoch=1, members=("a", "b", "c"), weights=(0.4, 0.3, 0.3),
                           reason="join")
    membership = member_a(server)
    time.sleep(TIMEOUT_S * 1.5)
    assert not membership.lost_member(same)
