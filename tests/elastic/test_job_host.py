"""The job host's word on how far its job got (`reached.json`), which the
coordinator settles pay and roots proof epochs by, tried as the members that
would move it: beats of a step far ahead, a beat that does not parse."""

from __future__ import annotations

import pytest

from shoal.elastic.job_host import _write_reached, read_reached
from shoal.elastic.serve import RendezvousServer
from shoal.spec.elastic import MembershipEpoch, Phase, ProgressBeat


@pytest.fixture
def host():
    server = RendezvousServer("127.0.0.1")
    server.rdzv.publish_epoch(MembershipEpoch(epoch=0, members=("a", "b", "c"),
                                              weights=(1.0, 1.0, 1.0), reason="start"))
    yield server
    server.close()


def beat(server: RendezvousServer, worker: str, step: int) -> None:
    server.rdzv.beat(worker, ProgressBeat(epoch=0, count=1, step=step, phase=Phase.voted))


def test_members_beating_far_ahead_move_the_job_no_further_than_an_honest_member(host, tmp_path):
    """b and c beat step 19, first while a has not beaten yet, then while a is on step 3:
    the job reached step 2, the newest step every member committed (a beat names the
    step a member is on)."""
    assert _write_reached(host, tmp_path, None) is None  # no member has beaten yet
    beat(host, "b", 19)
    beat(host, "c", 19)
    assert _write_reached(host, tmp_path, None) is None  # nor has a, the honest one
    assert read_reached(tmp_path) is None
    beat(host, "a", 3)
    assert _write_reached(host, tmp_path, None) == 2 == read_reached(tmp_path)
    beat(host, "a", 6)
    assert _write_reached(host, tmp_path, 2) == 5 == read_reached(tmp_path)


def test_what_the_job_reached_never_goes_back(host, tmp_path):
    """A member beating step 0 (a joiner before it has the state) or a beat that does not
    parse leaves the job where it got to."""
    for worker in "abc":
        beat(host, worker, 8)
    assert _write_reached(host, tmp_path, None) == 7
    beat(host, "c", 0)
    assert _write_reached(host, tmp_path, 7) == 7 == read_reached(tmp_path)
    host.rdzv.store.set("hb/c", "not a beat")
    assert _write_reached(host, tmp_path, 7) == 7 == read_reached(tmp_path)
