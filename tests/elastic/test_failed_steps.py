"""Steps that keep failing with no fault seen (issue 40: a member withholding its part
of every exchange): members held out in turn, never blamed, and the run given up only
when no member's absence lets a step commit."""

from __future__ import annotations

from shoal.elastic.authority import AuthorityConfig, MembershipAuthority
from shoal.elastic.failed_steps import FailedSteps, GiveUp, HoldOut, Reform
from shoal.elastic.liveness import LivenessConfig
from shoal.elastic.serve import RendezvousServer

ABC = ("a", "b", "c")


def test_after_the_second_failure_each_member_is_held_out_in_turn_then_the_run_given_up():
    failures = FailedSteps(max_reforms=5, hold_s=60.0)
    assert failures.failed(ABC, 30, 0.0) == Reform()  # a glitch: the same members again
    assert failures.failed(ABC, 30, 1.0) == HoldOut(("b", "c"), "a")
    assert failures.failed(("b", "c"), 30, 2.0) == HoldOut(("a", "c"), "b")  # a is back
    assert failures.failed(("a", "c"), 30, 3.0) == HoldOut(("a", "b"), "c")
    assert not failures.holds("a", 3.0) and failures.holds("c", 3.0)
    given_up = failures.failed(("a", "b"), 30, 4.0)
    assert isinstance(given_up, GiveUp) and "every one of ['a', 'b', 'c']" in given_up.reason


def test_the_member_whose_absence_let_a_step_commit_is_held_out_first_next_time():
    """The withholder is c: the epoch without it commits. It comes back after its hold
    and fails the job again: it is held out at the first failure (one failed exchange
    per hold, not four). Were it not the cause, the others follow in turn."""
    failures = FailedSteps(max_reforms=5, hold_s=60.0)
    failures.failed(ABC, 30, 0.0)
    assert failures.failed(ABC, 30, 1.0).out == "a"
    assert failures.failed(("b", "c"), 30, 2.0).out == "b"
    assert failures.failed(("a", "c"), 30, 3.0).out == "c"
    assert failures.holds("c", 62.0) and not failures.holds("c", 63.5)  # its time is up
    failures.forget(90)  # c joins back (the authority ends the streak), steps moved on
    assert failures.failed(ABC, 90, 70.0) == HoldOut(("a", "b"), "c")  # at once
    assert failures.failed(("a", "b"), 90, 71.0).out == "a"  # not c after all: in turn
    assert failures.failed(("b", "c"), 90, 72.0).out == "b"


def test_one_member_or_a_resync_is_re_formed_until_the_limit():
    alone = FailedSteps(max_reforms=2)
    assert [alone.failed(("a",), 7, t) for t in (0.0, 1.0)] == [Reform(), Reform()]
    assert isinstance(alone.failed(("a",), 7, 2.0), GiveUp)
    resync = FailedSteps(max_reforms=2)
    outcomes = [resync.failed(ABC, 7, t, hold_out=False) for t in (0.0, 1.0, 2.0)]
    assert outcomes[:2] == [Reform(), Reform()] and isinstance(outcomes[2], GiveUp)


def test_the_authority_holds_a_member_out_and_admits_it_back_only_after_its_time():
    server = RendezvousServer("127.0.0.1")
    rdzv = server.rdzv
    try:
        authority = MembershipAuthority(rdzv, AuthorityConfig(
            min_workers=3, hold_out_s=5.0,
            liveness=LivenessConfig(floor_s=60.0, initial_s=60.0)))
        for worker in ABC:
            rdzv.request_join(worker)
        authority.tick(0.0)
        for now in (1.0, 2.0):  # the step fails twice with no fault seen
            authority.request_reform(authority.epoch)
            authority.tick(now)
        latest = rdzv.epoch(rdzv.latest_epoch())
        assert (latest.members, latest.reason) == (("b", "c"), "hold-out:a")
        rdzv.report_progress(31)  # the epoch without a committed a step
        rdzv.request_join("a")  # a, outside the newest epoch, asks to come back
        authority.tick(3.0)
        assert rdzv.latest_epoch() == 2  # held out: not yet
        authority.tick(7.5)
        latest = rdzv.epoch(rdzv.latest_epoch())
        assert (latest.members, latest.reason) == (("b", "c", "a"), "join")
        assert authority.failure is None
    finally:
        server.close()
