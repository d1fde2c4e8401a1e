"""Attacks in a bisection dispute: whoever lies about a state, answers out of
turn, changes an answer or goes silent ends as the loser, and the honest
party never does; the dispute always narrows to the first divergent step."""

from __future__ import annotations

import math

import pytest

from shoal.proof import Bisection, DisputeClosed, DisputeError, Party, WrongQuery, losers, play
from shoal.proof.errors import ClockWentBack


def honest(step: int) -> str:
    """The true state after `step`: each one derived from the one before, as in training."""
    return f"state-{step}"


def diverging_at(first: int):
    """A party whose claimed trajectory leaves the true one at step `first` and never returns."""
    return lambda step: honest(step) if step < first else f"forged-{step}"


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 7, 8, 9, 16, 25, 33, 100])
def test_the_dispute_finds_the_first_divergent_step_in_log_rounds(length):
    lo = 10
    for first in range(lo + 1, lo + length + 1):
        outcome, rounds = play(lo, lo + length, diverging_at(first), honest)
        assert outcome.step == first
        assert outcome.from_state == honest(first - 1)
        assert rounds <= math.ceil(math.log2(length))
        # The referee re-executes that one step from the agreed state.
        assert losers(outcome, recomputed=honest(first)) == {Party.claimant}


@pytest.mark.parametrize("first", [1, 2, 13, 24, 25])
def test_a_malicious_challenger_that_accuses_an_honest_worker_loses(first):
    outcome, _ = play(0, 25, honest, diverging_at(first))
    assert losers(outcome, recomputed=honest(outcome.step)) == {Party.challenger}


def test_a_cheat_that_copies_the_challengers_answers_still_loses():
    # Agreeing with every midpoint moves the dispute to the cheat's own claim at
    # hi, committed before the dispute; the referee recomputes the honest state.
    claims_hi = "forged-25"
    outcome, _ = play(0, 25, lambda s: claims_hi if s == 25 else honest(s), honest)
    assert outcome.step == 25
    assert losers(outcome, recomputed=honest(25)) == {Party.claimant}


@pytest.mark.parametrize("silent", list(Party))
def test_a_party_that_stops_answering_loses_by_default(silent):
    # The silent party opened with a claim at 25 that differs from the other's,
    # then answers nothing in between: stalling cannot win or hang the dispute.
    def quits(step: int) -> str | None:
        return "claimed-25" if step == 25 else honest(step) if step == 0 else None

    claimant, challenger = (quits, honest) if silent is Party.claimant else (honest, quits)
    outcome, rounds = play(0, 25, claimant, challenger)
    assert outcome.step is None and rounds == 0
    assert losers(outcome) == {silent}


def open_dispute(now_s: float = 0.0) -> Bisection:
    return Bisection(0, 16, honest(0), {Party.claimant: "forged-16", Party.challenger: honest(16)},
                     timeout_s=10.0, now_s=now_s)


def test_answers_out_of_turn_or_repeated_are_refused():
    dispute = open_dispute()
    assert dispute.next_query() == 8
    with pytest.raises(WrongQuery, match="asks for step 8, not 9"):
        dispute.answer(Party.claimant, 9, honest(9), 1.0)
    dispute.answer(Party.claimant, 8, "forged-8", 1.0)
    with pytest.raises(WrongQuery, match="already answered"):
        dispute.answer(Party.claimant, 8, honest(8), 2.0)  # a change of mind after a peek


def test_a_late_answer_is_refused_and_the_late_party_loses():
    dispute = open_dispute()
    dispute.answer(Party.challenger, 8, honest(8), 5.0)
    with pytest.raises(DisputeClosed, match="after the deadline"):
        dispute.answer(Party.claimant, 8, honest(8), 10.5)
    assert losers(dispute.outcome) == {Party.claimant}
    with pytest.raises(DisputeClosed):
        dispute.answer(Party.challenger, 8, honest(8), 11.0)


def test_each_round_gets_a_fresh_deadline_and_both_silent_both_lose():
    dispute = open_dispute()
    dispute.answer(Party.claimant, 8, honest(8), 9.0)
    dispute.answer(Party.challenger, 8, honest(8), 9.5)
    assert dispute.next_query() == 12 and dispute.deadline_s == 19.5
    assert not dispute.tick(19.5)
    assert dispute.tick(19.6)
    assert losers(dispute.outcome) == set(Party)


def test_the_clock_cannot_go_back_and_a_converged_dispute_needs_the_referee():
    dispute = open_dispute(now_s=5.0)
    with pytest.raises(ClockWentBack):
        dispute.tick(4.0)
    one_step = Bisection(3, 4, honest(3), {Party.claimant: "x", Party.challenger: honest(4)}, 1.0, 0.0)
    assert one_step.next_query() is None and one_step.outcome.step == 4
    with pytest.raises(DisputeError, match="re-execute step 4"):
        losers(one_step.outcome)


def test_a_dispute_needs_a_disagreement():
    with pytest.raises(DisputeError):
        Bisection(0, 8, "a", {Party.claimant: "b", Party.challenger: "b"}, 1.0, 0.0)
    with pytest.raises(DisputeError):
        Bisection(8, 8, "a", {Party.claimant: "b", Party.challenger: "c"}, 1.0, 0.0)
    with pytest.raises(DisputeError, match="do not agree at step 0"):
        play(0, 8, diverging_at(0), honest)
