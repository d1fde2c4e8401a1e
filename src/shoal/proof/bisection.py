"""Bisection disputes (Truebit, Verde): narrow a disputed epoch to one step.

The claimant (whose work is disputed) and the challenger each claim the
hash of the state after every step; they agree at `lo` and not at `hi`.
Both answer the midpoint, the interval halves, and after ⌈log2(hi − lo)⌉
rounds one step is left: agreed before it, disputed after it. The referee
re-executes only that step. Pure: the caller passes the time in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shoal.proof.errors import ClockWentBack, DisputeClosed, DisputeError, WrongQuery


class Party(str, enum.Enum):
    claimant = "claimant"  # the worker whose claimed trajectory is disputed
    challenger = "challenger"  # the verifier or whistleblower that disputes it


@dataclass(frozen=True)
class Outcome:
    """How a dispute ended: at one step for the referee, or by default."""

    step: int | None  # the step the referee re-executes (None if decided by default)
    from_state: str | None  # the agreed state before `step`, that the referee starts from
    claims: Mapping[Party, str] = field(default_factory=dict)  # each party's state after `step`
    defaulted: frozenset[Party] = frozenset()  # parties that did not answer in time: they lose


class Bisection:
    """The state machine of one dispute over steps (lo, hi]."""

    def __init__(self, lo: int, hi: int, lo_state: str, hi_claims: Mapping[Party, str],
                 timeout_s: float, now_s: float) -> None:
        if hi <= lo:
            raise DisputeError(f"a dispute needs lo < hi, got lo={lo}, hi={hi}")
        if set(hi_claims) != set(Party) or hi_claims[Party.claimant] == hi_claims[Party.challenger]:
            raise DisputeError(f"both parties must claim different states at step {hi}; "
                               "with one state there is nothing to dispute")
        if timeout_s <= 0:
            raise DisputeError(f"timeout_s is {timeout_s}; parties need time to answer")
        self.lo, self.hi = lo, hi
        self.timeout_s = timeout_s
        self.rounds = 0
        # Every answer given, per step: the agreed state at lo and the claims at hi included.
        self._states: dict[int, dict[Party, str]] = {lo: dict.fromkeys(Party, lo_state),
                                                     hi: dict(hi_claims)}
        self._now_s = now_s
        self._deadline_s = now_s + timeout_s
        self._answers: dict[Party, str] = {}
        self.outcome: Outcome | None = None
        self._converge_if_done()

    def next_query(self) -> int | None:
        """The step both parties must answer next, or None once the dispute is decided."""
        return None if self.outcome else (self.lo + self.hi) // 2

    @property
    def deadline_s(self) -> float:
        return self._deadline_s

    def answer(self, party: Party, step: int, state_hash: str, now_s: float) -> None:
        """`party` claims `state_hash` after `step`; once both have answered, the interval halves."""
        if self.tick(now_s):
            raise DisputeClosed(f"{party.value} answered at {now_s} s, after the deadline "
                                f"{self._deadline_s} s; the dispute was decided by default")
        if self.outcome:
            raise DisputeClosed(f"the dispute is decided at step {self.outcome.step}; no more answers")
        if step != self.next_query():
            raise WrongQuery(f"the dispute asks for step {self.next_query()}, not {step}")
        if party in self._answers:
            # A second answer would let a party change its claim after seeing the other's.
            raise WrongQuery(f"{party.value} has already answered step {step}")
        self._answers[party] = state_hash
        if len(self._answers) == len(Party):
            self._halve(step)

    def tick(self, now_s: float) -> bool:
        """Applies the time; every party that let the deadline pass unanswered loses.
        Returns whether this call decided the dispute."""
        if now_s < self._now_s:
            raise ClockWentBack(now_s, self._now_s)
        self._now_s = now_s
        if self.outcome or now_s <= self._deadline_s:
            return False
        silent = frozenset(p for p in Party if p not in self._answers)
        self.outcome = Outcome(step=None, from_state=None, defaulted=silent)
        return True

    def _halve(self, step: int) -> None:
        self._states[step] = self._answers
        if self._answers[Party.claimant] == self._answers[Party.challenger]:
            self.lo = step
        else:
            self.hi = step
        self.rounds += 1
        self._answers = {}
        self._deadline_s = self._now_s + self.timeout_s
        self._converge_if_done()

    def _converge_if_done(self) -> None:
        if self.hi - self.lo == 1:
            agreed = self._states[self.lo][Party.claimant]
            self.outcome = Outcome(step=self.hi, from_state=agreed, claims=dict(self._states[self.hi]))


def losers(outcome: Outcome, recomputed: str | None = None) -> frozenset[Party]:
    """Who loses: the silent parties of a default, else every party whose claim
    differs from the referee's re-execution (`recomputed`) of the one step."""
    if outcome.step is None:
        return outcome.defaulted
    if recomputed is None:
        raise DisputeError(f"the referee must re-execute step {outcome.step} to decide the dispute")
    return frozenset(p for p, claim in outcome.claims.items() if claim != recomputed)


Answerer = Callable[[int], "str | None"]  # the state after a step, or None to stay silent


def play(lo: int, hi: int, claimant: Answerer, challenger: Answerer,
         timeout_s: float = 60.0) -> tuple[Outcome, int]:
    """Runs a whole dispute against two answering functions; returns the outcome and
    the rounds it took. A party answering None misses that round's deadline."""
    start = claimant(lo)
    if start is None or start != challenger(lo):
        raise DisputeError(f"the parties do not agree at step {lo}; start the dispute earlier")
    hi_claims = {Party.claimant: claimant(hi), Party.challenger: challenger(hi)}
    if None in hi_claims.values():
        raise DisputeError(f"both parties must claim a state at step {hi} to open the dispute")
    now_s = 0.0
    dispute = Bisection(lo, hi, start, hi_claims, timeout_s, now_s)  # type: ignore[arg-type]
    while (step := dispute.next_query()) is not None:
        for party, answerer in ((Party.claimant, claimant), (Party.challenger, challenger)):
            state = answerer(step)
            if state is not None:
                dispute.answer(party, step, state, now_s)
        if dispute.next_query() == step:  # someone stayed silent: the deadline passes
            now_s = dispute.deadline_s + 1.0
            dispute.tick(now_s)
    assert dispute.outcome is not None
    return dispute.outcome, dispute.rounds
