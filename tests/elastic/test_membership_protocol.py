"""The authority and the commit protocol against a real rendezvous store, in one process."""

from __future__ import annotations

import threading

import pytest

from shoal.elastic.authority import AuthorityConfig, MembershipAuthority
from shoal.elastic.serve import RendezvousServer
from shoal.elastic.liveness import LivenessConfig
from shoal.elastic.decider import decide_step
from shoal.spec.elastic import (
    GuardVerdict,
    MembershipEpoch,
    Phase,
    ProgressBeat,
    StepBallot,
    StepDecision,
)
from shoal.train.commit import agree
from shoal.train.rendezvous import Rendezvous, RunFailed, connect

FAST = LivenessConfig(floor_s=0.5, initial_s=0.5)


def another(rdzv: Rendezvous) -> Rendezvous:
    """A connection of its own to the same store (a thread blocked in a wait holds its
    connection: a TCPStore client serves one request at a time)."""
    return Rendezvous(connect(rdzv.store.host, rdzv.store.port))


@pytest.fixture
def rdzv():
    server = RendezvousServer("127.0.0.1")  # binds its own port: no race
    yield server.rdzv
    server.close()


def test_authority_forms_drops_admits_and_reforms(rdzv):
    alive = {"a": True, "b": True, "c": True}
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, liveness=FAST),
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
    assert rdzv.latest_epoch() == 1  # a join waits a moment for a fault to publish with
    authority.tick(0.2)
    assert rdzv.epoch(2).members == ("a", "c") and rdzv.epoch(2).reason == "join"

    authority.request_reform(2)  # what its step decider asks after a failed step
    authority.tick(0.3)
    assert rdzv.epoch(3).members == ("a", "c") and rdzv.epoch(3).reason == "reform"

    rdzv.request_leave("c")
    authority.tick(0.4)
    assert rdzv.epoch(4).members == ("a",) and rdzv.epoch(4).reason == "leave:c"


def test_an_exit_reported_by_another_hosts_launcher_drops_the_worker(rdzv):
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, liveness=FAST))
    rdzv.request_join("a")
    rdzv.request_join("b")
    authority.tick(0.0)
    rdzv.report_exit("b")
    authority.tick(0.01)
    assert rdzv.epoch(1).members == ("a",) and rdzv.epoch(1).reason == "exit:b"


def _beat(rdzv, worker, epoch, count, step, phase, waits=0):
    rdzv.beat(worker, ProgressBeat(epoch=epoch, count=count, step=step, phase=phase, waits=waits))


def _started(rdzv, members: str) -> MembershipAuthority:
    """An authority whose first epoch holds `members` (one letter each)."""
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=len(members), liveness=FAST))
    for who in members:
        rdzv.request_join(who)
    authority.tick(0.0)
    return authority


def test_a_member_that_falls_behind_is_fenced_however_alive_it_is(rdzv):
    """b's process runs (it could be beating a heartbeat) but makes no progress."""
    authority = _started(rdzv, "ab")
    for who in "ab":
        _beat(rdzv, who, 0, 1, 0, Phase.arrived)
    _beat(rdzv, "a", 0, 2, 0, Phase.exchange)  # a computed its share; b hangs in its loader
    authority.tick(0.1)
    authority.tick(0.5)  # within the deadline: b may just be slower
    assert rdzv.latest_epoch() == 0
    authority.tick(0.7)
    assert rdzv.epoch(1).members == ("a",) and rdzv.epoch(1).reason == "stall:b"


def test_a_member_that_cannot_reach_the_store_is_fenced_even_if_all_wait_at_one_point(rdzv):
    """Every member is in the same exchange (a partition cut c off mid-collective):
    nobody is behind, but a and b keep refreshing their point and c does not."""
    authority = _started(rdzv, "abc")
    for who in "abc":
        _beat(rdzv, who, 0, 2, 0, Phase.exchange)
    authority.tick(0.1)
    for waits, now in enumerate((0.3, 0.5, 0.7), start=1):
        for who in "ab":
            _beat(rdzv, who, 0, 2, 0, Phase.exchange, waits)
        authority.tick(now)
    assert rdzv.epoch(1).members == ("a", "b") and rdzv.epoch(1).reason == "stall:c"


def test_members_that_all_go_quiet_together_are_not_fenced(rdzv):
    """All computing a long step (or an evaluation): no one is waiting on anyone."""
    authority = _started(rdzv, "ab")
    for who in "ab":
        _beat(rdzv, who, 0, 3, 0, Phase.voted)
    for now in (0.1, 1.0, 2.0, 5.0):
        authority.tick(now)
    assert rdzv.latest_epoch() == 0


def test_a_replacement_called_in_at_a_fault_joins_in_the_same_epoch(rdzv):
    alive = {"a": True, "b": True, "c": True}
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, liveness=FAST),
                                    process_alive=lambda w: alive.get(w))
    rdzv.request_join("a")
    rdzv.request_join("b")
    authority.tick(0.0)
    rdzv.request_join("c")  # the spare is called in first ...
    authority.tick(0.01)
    alive["b"] = False  # ... and the exit is seen a moment later
    authority.tick(0.03)
    assert rdzv.latest_epoch() == 1
    assert rdzv.epoch(1).members == ("a", "c") and rdzv.epoch(1).reason == "exit:b"


def test_a_waiting_spare_is_woken_by_its_call_not_by_a_timer():
    """A warm spare blocks on the store until it is called in, so its join request lands
    beside the fault it replaces (and the authority publishes both as one epoch)."""
    from shoal.train.rendezvous import Rendezvous, connect

    server = RendezvousServer("127.0.0.1")
    try:
        spare = Rendezvous(connect("127.0.0.1", server.port))  # the spare's own connection
        assert not spare.wait_activated("s", timeout_s=0.05)  # not called in yet
        woken: list[bool] = []
        waiter = threading.Thread(target=lambda: woken.append(
            spare.wait_activated("s", timeout_s=120.0)))
        waiter.start()
        server.rdzv.activate("s")
        waiter.join(timeout=30.0)
        assert woken == [True]  # returned because it was called in, long before its timeout
    finally:
        server.close()


def test_a_joiner_waiting_at_the_barrier_never_gets_the_state_holders_fenced(rdzv):
    """a and b are stuck in the previous epoch's exchange (a peer was cut off, and
    they wait out its deadline); the fresh joiner c arrives at once. Only c is ahead,
    but c holds no state: fencing a and b would lose the job's state."""
    authority = _started(rdzv, "ab")
    for who in "ab":
        _beat(rdzv, who, 0, 2, 0, Phase.exchange)
    rdzv.request_join("c")
    authority.tick(0.1)
    authority.tick(0.25)  # the join is published: epoch 1 = a, b, c
    assert rdzv.epoch(1).members == ("a", "b", "c")
    _beat(rdzv, "c", 1, 1, 0, Phase.arrived)
    for waits, now in enumerate((0.5, 1.0, 1.5, 2.0, 2.5, 3.0), start=1):
        for who in "ab":  # still waiting in epoch 0's exchange, and saying so
            _beat(rdzv, who, 0, 2, 0, Phase.exchange, waits)
        _beat(rdzv, "c", 1, 1, 0, Phase.arrived, waits)
        authority.tick(now)
    assert rdzv.latest_epoch() == 1


def test_the_deadline_follows_measured_step_times():
    from shoal.elastic.liveness import ProgressWatch

    watch = ProgressWatch(LivenessConfig(floor_s=0.2, initial_s=30.0, step_multiple=3.0,
                                         margin_s=0.1))
    watch.reset(0, 0.0)
    assert watch.step_deadline_s() == 30.0  # nothing measured yet
    for look in range(6):
        now = 1.0 + 0.5 * look
        # Each look catches the members in some phase of a later step (never a vote),
        # two steps on from the last look: each step took 0.25 s.
        beats = {w: ProgressBeat(epoch=0, count=2 + 4 * look, step=2 * look, phase=Phase.exchange)
                 for w in "ab"}
        assert watch.laggards(beats, now) == []
    assert watch.step_deadline_s() == pytest.approx(3 * 0.25 + 0.1)


def test_reforms_that_never_commit_give_the_run_up(rdzv):
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=1, liveness=FAST,
                                                          max_failed_reforms=2))
    rdzv.request_join("a")
    authority.tick(0.0)
    for attempt in range(3):
        authority.request_reform(authority.epoch)
        authority.tick(0.01 * (attempt + 1))
    assert authority.failure and "failed 2 times" in authority.failure
    with pytest.raises(RunFailed):
        rdzv.check_failed()


def test_a_resync_reform_names_whose_state_stands(rdzv):
    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=2, liveness=FAST))
    rdzv.request_join("a")
    rdzv.request_join("b")
    authority.tick(0.0)
    authority.request_reform(0, state_source="b")
    authority.tick(0.01)
    assert rdzv.epoch(1).state_source == "b" and rdzv.epoch(1).reason == "resync"


def _epoch(number, members):
    return MembershipEpoch(epoch=number, members=members, weights=(1.0,) * len(members))


def _ballot(ok=True, verdict=GuardVerdict.apply, fingerprint=5, step=7):
    return StepBallot(step=step, ok=ok, verdict=verdict, fingerprint=fingerprint if ok else None)


def _deciding(rdzv, members, **config):
    """A started authority (its step decider runs) whose first epoch holds `members`
    (one letter each), who vote by hand."""
    config = {"liveness": LivenessConfig(floor_s=60.0, initial_s=60.0), **config}
    authority = MembershipAuthority(another(rdzv), AuthorityConfig(min_workers=len(members),
                                                                    **config))
    for who in members:
        rdzv.request_join(who)
    authority.start(watch_requests=another(rdzv))
    return authority, _next_epoch(rdzv, -1)


def _next_epoch(rdzv, after):
    for _ in range(500):
        if rdzv.latest_epoch() > after:
            return rdzv.epoch(rdzv.latest_epoch())
        threading.Event().wait(0.01)
    raise AssertionError(f"no epoch after {after}")


@pytest.fixture
def stopping():
    started = []
    yield started.append
    for authority in started:
        authority.stop()


def _vote_in_threads(rdzv, record, ballots, index=0):
    results = {}

    def vote(worker, ballot):
        results[worker] = agree(another(rdzv), record, worker, index, ballot)

    threads = [threading.Thread(target=vote, args=item) for item in ballots.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_step_commits_only_if_every_exchange_succeeded(rdzv, stopping):
    authority, record = _deciding(rdzv, "abc")
    stopping(authority)
    decided = _vote_in_threads(rdzv, record, {"a": _ballot(), "b": _ballot(), "c": _ballot()})
    assert len(decided) == 3 and all(d.commit for d in decided.values())

    decided = _vote_in_threads(rdzv, record, {"a": _ballot(), "b": _ballot(ok=False),
                                              "c": _ballot()}, index=1)
    assert len(decided) == 3 and not any(d.commit for d in decided.values())
    assert _next_epoch(rdzv, 0).reason == "reform"


def test_the_strictest_guard_verdict_stands_for_every_rank(rdzv, stopping):
    authority, record = _deciding(rdzv, "abc")
    stopping(authority)
    decided = _vote_in_threads(rdzv, record, {"a": _ballot(),
                                              "b": _ballot(verdict=GuardVerdict.rollback),
                                              "c": _ballot(verdict=GuardVerdict.skip)})
    assert {d.verdict for d in decided.values()} == {GuardVerdict.rollback}
    assert all(d.commit for d in decided.values())


def test_differing_replicas_discard_the_step_and_the_authority_names_the_most_common(rdzv,
                                                                                      stopping):
    authority, record = _deciding(rdzv, "abc")
    stopping(authority)
    a, b, c = record.members  # in the order they joined
    decided = _vote_in_threads(rdzv, record, {a: _ballot(fingerprint=1),
                                              b: _ballot(fingerprint=2),
                                              c: _ballot(fingerprint=2)})
    source = record.members[1]  # the lower rank of the two alike
    assert all(not d.commit and d.resync_from == source for d in decided.values())
    resync = _next_epoch(rdzv, 0)
    assert resync.state_source == source and resync.reason == "resync"


def test_a_member_cannot_name_itself_the_state_source():
    """Issue 40, point 6: c's ballot differs; the state that stands is the majority's,
    whatever c says. On a tie, the lowest rank's (the only choice without a majority)."""
    record = _epoch(3, ("a", "b", "c"))
    ballots = {"a": _ballot(fingerprint=1), "b": _ballot(fingerprint=1), "c": _ballot(fingerprint=9)}
    outcome = decide_step(record, ballots, 3, lambda: None)
    assert outcome.reform and outcome.decision.resync_from == "a" and not outcome.decision.commit
    tie = decide_step(_epoch(3, ("a", "c")), {"a": ballots["a"], "c": ballots["c"]}, 3, lambda: None)
    assert tie.decision.resync_from == "a"


def test_ballots_on_different_steps_or_without_a_fingerprint_commit_nothing():
    record = _epoch(0, ("a", "b"))
    outcome = decide_step(record, {"a": _ballot(), "b": _ballot(step=8)}, 0, lambda: None)
    assert not outcome.decision.commit and outcome.reform
    blind = StepBallot(step=7, ok=True)
    outcome = decide_step(record, {"a": _ballot(), "b": blind}, 2, lambda: None)
    assert not outcome.decision.commit and outcome.decision.next_epoch == 2 and not outcome.reform


def test_new_weights_only_when_a_ballot_says_they_are_due():
    record = _epoch(0, ("a", "b"))
    asked = []

    def weights():
        asked.append(1)
        return (1.0, 3.0)

    assert decide_step(record, {"a": _ballot(), "b": _ballot()}, 0, weights).decision.weights is None
    due = _ballot().model_copy(update={"rebalance": True})
    assert decide_step(record, {"a": due, "b": due}, 0, weights).decision.weights == (1.0, 3.0)
    assert asked == [1]


def test_a_dropped_member_no_longer_blocks_the_decision(rdzv, stopping):
    authority, record = _deciding(rdzv, "abc")
    stopping(authority)
    # c is dropped without notice (its launcher saw its process exit) while a and b wait.
    timer = threading.Timer(0.2, lambda: another(rdzv).report_exit("c"))
    timer.start()
    decided = _vote_in_threads(rdzv, record, {"a": _ballot(), "b": _ballot()})  # c never votes
    # The survivors redo the step in the next epoch rather than wait for c.
    assert len(decided) == 2 and all(not d.commit and d.next_epoch == 1 for d in decided.values())
    # c, waking up, casts its ballot and finds the step discarded: it is no member of epoch 1.
    late = agree(another(rdzv), record, "c", 0, _ballot())
    assert not late.commit and "c" not in rdzv.epoch(late.next_epoch).members


def test_a_member_that_gave_notice_is_waited_for_then_given_up(rdzv, stopping):
    authority, record = _deciding(rdzv, "ab", leaver_grace_s=0.3)
    stopping(authority)
    rdzv.request_leave("b")
    assert _next_epoch(rdzv, 0).reason == "leave:b"
    decided = _vote_in_threads(rdzv, record, {"a": _ballot()})  # b never votes
    assert decided["a"] == StepDecision(commit=False, next_epoch=1)


def test_a_member_behind_is_fenced_only_once_it_stops_making_progress():
    """DiLoCo: inner steps are not voted on, so at a round's end the lead waits at the
    outer step while a member still takes its last inner steps alone (or, at the start,
    still receives the live state over a slow link)."""
    from shoal.elastic.liveness import ProgressWatch

    watch = ProgressWatch(LivenessConfig(floor_s=0.2, initial_s=30.0, step_multiple=3.0,
                                         margin_s=0.1))
    watch.reset(0, 0.0, veterans=("a", "b"))
    receiving = ProgressBeat(epoch=0, count=1, step=0, phase=Phase.arrived)
    for look in range(6):  # a steps, 0.25 s a step; b receives the state, refreshing
        beats = {"a": ProgressBeat(epoch=0, count=look + 2, step=look, phase=Phase.stepped),
                 "b": receiving.model_copy(update={"waits": look})}
        assert watch.laggards(beats, 0.25 * look) == []
    lead = ProgressBeat(epoch=0, count=20, step=19, phase=Phase.exchange)  # at the outer step
    for step in range(6):  # b got the state long after a waited; it steps, 0.25 s a step
        beats = {"a": lead, "b": ProgressBeat(epoch=0, count=step + 2, step=step,
                                              phase=Phase.stepped)}
        assert watch.laggards(beats, 5.0 + 0.25 * step) == []
    # Deadline 3 x 0.25 + 0.1: b, hung at step 5 since 6.25 s, is fenced after 7.1 s.
    assert watch.laggards(beats, 7.05) == []
    assert watch.laggards(beats, 7.15) == ["b"]


def test_a_new_epoch_gives_everyone_a_fresh_deadline_to_reach_it():
    from shoal.elastic.liveness import ProgressWatch

    watch = ProgressWatch(LivenessConfig(floor_s=0.5, initial_s=0.5))
    watch.reset(0, 0.0)
    beats = {"a": ProgressBeat(epoch=0, count=5, step=3, phase=Phase.exchange),
             "b": ProgressBeat(epoch=0, count=4, step=3, phase=Phase.stepped)}
    assert watch.laggards(beats, 0.1) == []
    watch.reset(1, 10.0, veterans=("a", "b"))  # b was behind for 10 s: a new race
    assert watch.laggards(beats, 10.1) == []


def test_the_deadline_never_falls_below_round_trips_to_the_store():
    """Across a WAN a report may wait on TCP's retransmission timers: 30 round trips of
    the slowest member's path, whatever the step time says."""
    from shoal.elastic.liveness import ProgressWatch

    watch = ProgressWatch(LivenessConfig(floor_s=0.2, initial_s=0.2, margin_s=0.0))
    watch.reset(0, 0.0)
    far = {"a": ProgressBeat(epoch=0, count=1, step=0, phase=Phase.arrived, rtt_s=0.0002),
           "b": ProgressBeat(epoch=0, count=1, step=0, phase=Phase.arrived, rtt_s=0.1)}
    watch.laggards(far, 0.0)
    assert watch.step_deadline_s() == pytest.approx(3.0)
    near = {w: b.model_copy(update={"rtt_s": 0.0002}) for w, b in far.items()}
    watch.laggards(near, 0.1)
    assert watch.step_deadline_s() == pytest.approx(0.2)


def test_the_authority_names_who_holds_the_state_for_a_joiner(rdzv, stopping):
    """After a decided step, a join epoch names a member that held the state through
    every epoch since (the lowest rank of them); after a resync, its source."""
    authority, record = _deciding(rdzv, "ab")
    stopping(authority)
    a, b = record.members
    _vote_in_threads(rdzv, record, {a: _ballot(), b: _ballot()})
    rdzv.request_join("c")
    joined = _next_epoch(rdzv, 0)
    assert joined.members == (a, b, "c") and joined.state_holder == a
    assert joined.state_source is None
    # A divergence in the join epoch: c's state differs; a and b are alike.
    _vote_in_threads(rdzv, joined, {a: _ballot(fingerprint=4), b: _ballot(fingerprint=3),
                                    "c": _ballot(fingerprint=3)})
    resync = _next_epoch(rdzv, 1)
    assert resync.state_source == b and resync.state_holder is None
    # The resync never forms (a is lost during it); the next epoch's holder is b alone.
    rdzv.report_exit(a)
    after = _next_epoch(rdzv, 2)
    assert after.members == (b, "c") and after.state_holder == b


def test_a_ballot_that_does_not_parse_fails_its_step_not_the_authority(rdzv, stopping):
    """Behind a gate a ballot must parse; a `shoal run` member is trusted, but its bad
    ballot must fail the step, not end the thread that decides every step after it."""
    assert not decide_step(_epoch(0, ("a", "b")), {"a": _ballot(), "b": None}, 0,
                           lambda: None).decision.commit
    authority, record = _deciding(rdzv, "ab")
    stopping(authority)
    a, b = record.members
    rdzv.store.compare_set(f"vote/0/0/{b}", "", "not a ballot")
    decided = _vote_in_threads(rdzv, record, {a: _ballot()})
    assert not decided[a].commit
    resync = _next_epoch(rdzv, 0)
    assert resync.reason == "reform"


def test_a_member_that_moved_on_to_a_newer_epoch_is_not_waited_for(rdzv, stopping):
    """Found by the quick demo: a join was published as epoch 0 formed; b, sending the
    state, saw it and left epoch 0 for epoch 1, while a had received the state, formed
    epoch 0, and waited for b's ballot on its first step. Epoch 1's barrier waited for
    a: both stalled until a was fenced (21 s), and the job's state was lost with it.
    Once b arrives at epoch 1's barrier, epoch 0's step is discarded."""
    from shoal.spec.elastic import WorkerArrival

    authority, record = _deciding(rdzv, "ab")
    stopping(authority)
    a, b = record.members
    rdzv.request_join("c")
    assert _next_epoch(rdzv, 0).reason == "join"
    rdzv.arrive(1, WorkerArrival(worker=b, step=0, has_state=True))
    decided = _vote_in_threads(rdzv, record, {a: _ballot()})  # b never votes in epoch 0
    assert decided[a] == StepDecision(commit=False, next_epoch=1)


# -- a member's word on its own progress (issue 40, point 6) ------------------------

def _deciding_by_hand(rdzv, members: str, **config):
    """A tick-driven authority whose step decider runs (so it knows the votes decided)."""
    from shoal.elastic.decider import StepDecider

    authority = MembershipAuthority(rdzv, AuthorityConfig(min_workers=len(members),
                                                          liveness=FAST, **config))
    for who in members:
        rdzv.request_join(who)
    authority.tick(0.0)
    authority.decider = StepDecider(lambda: another(rdzv), lambda: authority.epoch,
                                    authority.request_reform, authority._decided)
    authority.decider.follow(rdzv.epoch(0))
    return authority


def test_a_member_beating_far_ahead_gets_nobody_fenced(rdzv):
    """c withholds its part of the exchange a and b wait in, and beats as if it had
    voted on a step nine votes on (no vote of this epoch is decided yet). Before, its
    count made it the lead and a and b were fenced as behind it: c alone kept the job
    (and its state, and every later epoch's pay)."""
    authority = _deciding_by_hand(rdzv, "abc")
    try:
        for who in "abc":
            _beat(rdzv, who, 0, 1, 0, Phase.arrived)
        for waits, now in enumerate((0.1, 0.3, 0.5, 0.7, 0.9, 1.2, 1.5, 2.0)):
            for who in "ab":  # honest: in the exchange of vote 0, waiting, saying so
                rdzv.beat(who, ProgressBeat(epoch=0, count=2, step=0, phase=Phase.exchange,
                                            waits=waits))
            rdzv.beat("c", ProgressBeat(epoch=0, count=40, step=30, phase=Phase.voted,
                                        vote=9, waits=waits))
            authority.tick(now)
        assert rdzv.latest_epoch() == 0  # nobody is behind a vote that was never decided
    finally:
        authority.decider.stop(rdzv)


def test_a_member_that_beats_finished_early_neither_stops_admissions_nor_escapes_fencing(rdzv):
    """c says it finished the job's 100 steps when none is decided: before, the authority
    took it at its word, admitted no joiner from then on, and never fenced c."""
    authority = _deciding_by_hand(rdzv, "abc", steps=100)
    try:
        for who in "ab":
            _beat(rdzv, who, 0, 2, 0, Phase.exchange)
        _beat(rdzv, "c", 0, 9, 100, Phase.finished)
        rdzv.request_join("d")
        authority.tick(0.1)
        authority.tick(0.25)  # the join batch is over: d is admitted
        assert rdzv.latest_epoch() == 1 and "d" in rdzv.epoch(1).members
    finally:
        authority.decider.stop(rdzv)


def test_a_member_claiming_steps_it_never_took_does_not_shorten_its_peers_deadline():
    """a and b take a step every 0.25 s; c reports a thousand steps more at every look.
    Before, the job's pace was read off the furthest report, so c drove the deadline
    down to its floor and a merely slow peer could be fenced."""
    from shoal.elastic.liveness import ProgressWatch

    watch = ProgressWatch(LivenessConfig(floor_s=0.2, initial_s=30.0, step_multiple=3.0,
                                         margin_s=0.1))
    watch.reset(0, 0.0)
    for look in range(8):
        beats = {w: ProgressBeat(epoch=0, count=2 + look, step=look, phase=Phase.exchange)
                 for w in "ab"}
        beats["c"] = ProgressBeat(epoch=0, count=2 + look, step=1000 * look, phase=Phase.exchange)
        watch.laggards(beats, 1.0 + 0.25 * look)
    assert watch.step_deadline_s() == pytest.approx(3 * 0.25 + 0.1)


def test_the_votes_an_epoch_passed_are_known_while_it_runs_and_once_it_is_closed(rdzv, stopping):
    """What caps a member's beats in its epoch: the votes decided there, and once the
    epoch is closed (a member dropped, the step in flight discarded) the votes its
    members passed, so that a late beat of the old epoch cannot lead the new one."""
    authority, record = _deciding(rdzv, "abc")
    stopping(authority)
    assert authority.decider.votes_decided(0) == 0
    assert _vote_in_threads(rdzv, record, {w: _ballot() for w in "abc"})["a"].commit
    assert authority.decider.votes_decided(0) == 1
    timer = threading.Timer(0.2, lambda: another(rdzv).report_exit("c"))
    timer.start()
    decided = _vote_in_threads(rdzv, record, {"a": _ballot(step=8), "b": _ballot(step=8)},
                               index=1)
    assert not decided["a"].commit and decided["a"].next_epoch == 1
    assert authority.decider.votes_decided(0) == 2  # closed: its members passed two votes
    assert authority.decider.votes_decided(1) == 0  # the new epoch, followed from its start
    assert authority.decider.votes_decided(7) is None  # never followed here


def test_a_claimed_speed_the_steps_refute_is_undone_and_not_published(rdzv, stopping):
    """Point 6, speeds at the host, through the real decider: c reports 10x the speed
    that a and b report, though all three compute alike. The rebalance point after step
    4 moves c's share up (as far as one move may, 1.5x); the steps after take as long as
    c's bigger share does, so the next point undoes the move, and the speed the job
    publishes for c (which its offer is held to) is the one its share stood at.
    Before: c kept 10/12 of every step, and its 10x stood in `speeds.json`."""
    authority, record = _deciding(rdzv, "abc")
    stopping(authority)
    now = [0.0]
    authority.decider.clock = lambda: now[0]  # the host's clock, as the steps move it
    for member, speed in (("a", 100.0), ("b", 100.0), ("c", 1000.0)):
        rdzv.report_speed(member, speed)
    weights, batch, true_speed = record.weights, 300, 100.0
    for index in range(10):
        share = weights[2] / sum(weights)
        now[0] += max(w / sum(weights) * batch / true_speed for w in weights)  # the slowest
        ballots = {m: _ballot(step=index) for m in record.members}
        if index in (4, 9):  # rebalance points
            ballots = {m: b.model_copy(update={"rebalance": True}) for m, b in ballots.items()}
        decided = _vote_in_threads(rdzv, record, ballots, index=index)
        assert all(d.commit for d in decided.values())
        weights = decided["a"].weights or weights
        if index == 4:
            assert weights[2] / sum(weights) == pytest.approx(0.5)  # 1/3 -> 1/2: the bound
    assert share == pytest.approx(0.5) and weights == (1.0, 1.0, 1.0)  # undone at step 9
    assert authority.decider.moves.refuted == {"c"}
    assert authority.published_speeds(("a", "b", "c")) == {"a": 100.0, "b": 100.0, "c": 100.0}
