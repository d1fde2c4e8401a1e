"""Every voted step's decision, written by the membership authority alone (issue 40,
point 6).

Members cast their ballots under keys of their own (`vote/E/K/W`, shoal.train.commit);
the decider waits in the store until every member of the epoch has voted on its
K-th voted step, decides from the ballots, and writes `decision/E/K` once. So no
member can decide a step for the others, make a failed exchange commit, turn a
guard's rollback into an apply, or name itself a resync's state source: the state
that stands after a divergence is the most common fingerprint among the ballots
(the lowest rank on a tie), chosen here. The ballots stay in the store beside the
decision, so anyone can check the one against the others.

One thread per epoch, each on a connection of its own, blocked in a store wait
until the last ballot lands (the store answers at once: no polling). When a newer
epoch drops a member that has not voted and gave no notice (it died, or was fenced
while stalled), the authority's own thread discards the step in flight at once
(`discard_lost`): the survivors redo it in the new epoch rather than wait for a
ballot that will not come. Both threads write with compare-and-set, so whichever
comes first stands, and every member follows it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shoal.elastic.share_moves import EpochSteps, ShareMoves
from shoal.spec.elastic import GuardVerdict, MembershipEpoch, StepBallot, StepDecision
from shoal.train.rendezvous import Rendezvous, vote_key
from shoal.train.shares import moved_weights

log = logging.getLogger(__name__)

# A deciding thread blocks in the store at least this long at a time, three times the
# last step's length, and twice as long after each wait that ran out (so a slow job's
# waits rarely run out: torch's timed-wait race, shoal.train.rendezvous, needs a ballot to
# land just as one does; and each one that does makes c10d log a warning). Between waits
# it only looks whether someone else decided the step; nothing it does there is urgent.
# `stop` wakes every thread at once.
WAIT_S, WAIT_STEPS, MAX_WAIT_S = 1.0, 3.0, 30.0
# What `stop` writes under the ballots a thread still waits for (no member's: a ballot is
# JSON): the job is over, the step is decided by nobody.
STOPPED = "stopped"
# A superseded epoch's thread ends once its step in flight has had no ballot this long
# (its members moved on without forming it; a formed epoch's members vote on the step
# in flight long before, or their collective timed out first).
ABANDON_S = 120.0
_STRICTNESS = {GuardVerdict.apply: 0, GuardVerdict.skip: 1, GuardVerdict.rollback: 2}


@dataclass(frozen=True)
class Outcome:
    decision: StepDecision
    reform: bool = False  # re-form the same members (with decision.resync_from's state)


def decide_step(record: MembershipEpoch, ballots: dict[str, StepBallot | None], newest: int,
                weights_due: Callable[[], tuple[float, ...] | None]) -> Outcome:
    """The decision of a step every member of `record` voted on (None: a ballot that
    does not parse, a failed one). `newest`: the newest published epoch (members switch
    to it after this step); `weights_due`: new share weights, asked only when a ballot
    says they are due and the step commits."""
    cast = [ballots[m] for m in record.members]
    votes = [b for b in cast if b is not None]
    next_epoch = newest if newest > record.epoch else None
    verdict = max((b.verdict for b in votes), key=_STRICTNESS.__getitem__,
                  default=GuardVerdict.apply)
    ok = (len(votes) == len(cast) and all(b.ok and b.fingerprint is not None for b in votes)
          and len({b.step for b in votes}) == 1)
    if not ok:
        # A failed exchange anywhere (or ballots that do not agree on the step): nobody
        # applies it; the same members re-form, unless a newer epoch already waits.
        return Outcome(StepDecision(commit=False, next_epoch=next_epoch, verdict=verdict),
                       reform=next_epoch is None)
    prints = [b.fingerprint for b in votes]
    if len(set(prints)) > 1:
        best = max(range(len(prints)), key=lambda r: (prints.count(prints[r]), -r))
        source = record.members[best]
        log.warning("[epoch %d] replicas differ at step %d: all adopt %s's state (held by %d "
                    "of %d)", record.epoch, votes[0].step, source, prints.count(prints[best]),
                    len(prints))
        return Outcome(StepDecision(commit=False, next_epoch=next_epoch, verdict=verdict,
                                    resync_from=source), reform=True)
    weights = weights_due() if any(b.rebalance for b in votes) else None
    return Outcome(StepDecision(commit=True, next_epoch=next_epoch, weights=weights,
                                verdict=verdict))


@dataclass
class _Open:
    """An epoch whose voted steps this decider still decides."""

    record: MembershipEpoch
    index: int = 0  # its voted step in flight (counted from 0)
    superseded_at: float | None = None
    # members dropped by a newer epoch after giving notice -> when that was first seen
    leavers_seen: dict[str, float] = field(default_factory=dict)
    steps: EpochSteps = field(default_factory=EpochSteps)  # its step times, by this host's clock


class StepDecider:
    """Decides the voted steps of every published epoch; `follow(record)` when one is
    published, `stop()` at the end. `newest()`: the authority's newest epoch number;
    `reform(epoch, source)`: asks the authority to re-form `epoch`'s members."""

    def __init__(self, connect: Callable[[], Rendezvous], newest: Callable[[], int],
                 reform: Callable[[int, str | None], None],
                 decided: Callable[[MembershipEpoch, StepDecision], None] = lambda r, d: None
                 ) -> None:
        # Opens a connection of a thread's own (never the host's own store object: holding
        # it would keep the store serving after the host closed it).
        self.connect = connect
        self.newest = newest
        self.reform = reform
        self.decided = decided  # told every decision that stands (under the lock)
        self._lock = threading.Lock()  # one decision at a time: a thread's, or a discard
        self._open: dict[int, _Open] = {}
        self._closed: dict[int, int] = {}  # recently closed epochs -> the votes they passed
        # The job's steps done, as decided here: one past the newest step a committed
        # decision was made on (ballots on different steps commit nothing, so no member
        # alone can move it).
        self.steps_decided = 0
        self.moves = ShareMoves()  # share moves stand only if the steps after them are no slower
        self.clock: Callable[[], float] = time.monotonic  # what times the steps moves are held to
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def follow(self, record: MembershipEpoch) -> None:
        """Decide `record`'s steps (in a thread of its own) from now on."""
        with self._lock:
            now = time.monotonic()
            for held in self._open.values():
                held.superseded_at = held.superseded_at or now
            self._open[record.epoch] = _Open(record)
        thread = threading.Thread(target=self._run, args=(record.epoch,), daemon=True,
                                  name=f"step-decider-{record.epoch}")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def stop(self, rdzv: Rendezvous) -> None:
        """End every thread: each is woken (the ballots it waits for are marked STOPPED,
        never over a member's) and joined, so none is left inside a store call when the
        store closes (an exception thrown there while the interpreter exits aborts it)."""
        self._stop.set()
        with self._lock:
            waited = [(held.record, held.index) for held in self._open.values()]
        try:
            for record, index in waited:
                for member in record.members:
                    rdzv.store.compare_set(vote_key(record.epoch, index, member), "", STOPPED)
        except Exception:  # the store is gone already: the threads' waits have failed too
            log.debug("step decider: the store closed before the stop", exc_info=True)
        for thread in self._threads:
            thread.join(timeout=5)

    def discard_lost(self, rdzv: Rendezvous, newest: MembershipEpoch, grace_s: float) -> None:
        """Discard the step in flight of every older epoch with a member that has not
        voted on it and never will: one that `newest` dropped and is lost (it gave no
        notice: died, fenced; or exited; or gave notice and has not voted for `grace_s`
        since: its lease ended and the gate cut it off before it could), or one that has
        arrived at `newest`'s barrier (it left the older epoch without voting: that epoch
        formed for some of its members and not for it). Called on each of the
        authority's ticks while an older epoch is open."""
        now = time.monotonic()
        with self._lock:
            for held in list(self._open.values()):
                e = held.record.epoch
                if e >= newest.epoch:
                    continue
                silent = [m for m in held.record.members
                          if not rdzv.store.check([vote_key(e, held.index, m)])]
                dropped = [m for m in silent if m not in newest.members]
                moved = [m for m in silent if m in newest.members
                         and rdzv.store.check(rdzv.arrival_keys(newest.epoch, (m,)))]
                if not moved and not (dropped and self._lost(rdzv, held, dropped, now,
                                                             grace_s)):
                    continue
                decided = rdzv.decide(e, held.index,
                                      StepDecision(commit=False, next_epoch=newest.epoch))
                log.info("[epoch %d] voted step %d: %s", e, held.index,
                         "decided" if decided.commit else
                         f"discarded, {', '.join(moved) or 'a member'} "
                         f"{'moved on' if moved else 'is lost'}")
                # The state is where the epoch's last decided step left it: no new holders.
                self._close(held, decided, holders=False)

    def votes_decided(self, epoch: int) -> int | None:
        """The votes decided so far in `epoch` while its steps are decided here (its vote
        in flight is the next); once closed, the votes its members passed (the last one
        decided or discarded included); None if it was never followed here."""
        with self._lock:
            held = self._open.get(epoch)
            return self._closed.get(epoch) if held is None else held.index

    def has_open_before(self, epoch: int) -> bool:
        with self._lock:
            return any(e < epoch for e in self._open)

    @staticmethod
    def _lost(rdzv: Rendezvous, held: _Open, silent: list[str], now: float,
              grace_s: float) -> bool:
        gave_notice = set(rdzv.leaving(silent)) - set(rdzv.exited(silent))
        if any(m not in gave_notice for m in silent):
            return True
        first = min(held.leavers_seen.setdefault(m, now) for m in silent)
        return now - first > grace_s

    def _close(self, held: _Open, decision: StepDecision, holders: bool = True) -> None:
        """Under the lock: the next step of `held`, or its end (its members leave it).
        `holders`: tell the authority who holds the state now (not after a discard of
        a step some members never reached: they may hold no state at all)."""
        if holders:
            self.decided(held.record, decision)
        if not decision.commit or decision.next_epoch is not None:
            self._open.pop(held.record.epoch, None)
            epoch = held.record.epoch
            self._closed[epoch] = held.index + 1
            for old in [e for e in self._closed if e < epoch - 16]:
                del self._closed[old]
        else:
            held.index += 1
            held.leavers_seen.clear()

    # -- one epoch's thread --------------------------------------------------

    def _run(self, epoch: int) -> None:
        try:
            rdzv = self.connect()
        except Exception:  # the store is gone (the job ended): nothing left to decide
            log.debug("step decider of epoch %d: no store connection", epoch, exc_info=True)
            return
        wait_s, last = WAIT_S, time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                held = self._open.get(epoch)
                if held is None:
                    return
                record, index = held.record, held.index
            keys = [vote_key(epoch, index, m) for m in record.members]
            try:
                voted = rdzv.wait_keys(keys, wait_s, block=True)
                if self._stop.is_set():
                    return
                if voted:
                    ballots = rdzv.ballots(epoch, index, record.members)
            except Exception:  # the store closed under us at the job's end
                log.debug("step decider of epoch %d stops", epoch, exc_info=True)
                return
            try:
                with self._lock:
                    if self._open.get(epoch) is not held or held.index != index:
                        continue  # a discard decided it meanwhile
                    if not voted:
                        self._idle(rdzv, held, keys)
                        wait_s = min(MAX_WAIT_S, 2 * wait_s)
                        continue
                    self._decide(rdzv, held, index, ballots)
            except (RuntimeError, OSError) as error:  # c10d's, when the store went away
                log.warning("step decider of epoch %d stops: %s", epoch, error)
                return
            now = time.monotonic()
            wait_s, last = min(MAX_WAIT_S, max(WAIT_S, WAIT_STEPS * (now - last))), now

    def _decide(self, rdzv: Rendezvous, held: _Open, index: int,
                ballots: dict[str, StepBallot | None]) -> None:
        """Under the lock: decide `held`'s step `index` from every member's ballot."""
        record = held.record

        def weights_due() -> tuple[float, ...] | None:
            proposed = moved_weights(rdzv.speeds(record.members), record.weights)
            return self.moves.due(held.steps, record.members, record.weights, proposed)

        outcome = decide_step(record, ballots, self.newest(), weights_due)
        decision = rdzv.decide(record.epoch, index, outcome.decision)
        if decision.commit:
            step = max((b.step for b in ballots.values() if b is not None), default=-1)
            self.steps_decided = max(self.steps_decided, step + 1)
            held.steps.committed(self.clock(), step, decision.weights is not None)
        if decision == outcome.decision and outcome.reform:
            self.reform(record.epoch, decision.resync_from)
        if decision.weights:
            held.record = record.model_copy(update={"weights": decision.weights})
        self._close(held, decision)

    def _idle(self, rdzv: Rendezvous, held: _Open, keys: list[str]) -> None:
        """Under the lock, after a wait ran out: end the thread of an epoch abandoned.
        (Only this decider writes decisions, and a discard closes the step itself.)"""
        if (held.superseded_at is not None
              and time.monotonic() - held.superseded_at > ABANDON_S
              and not any(rdzv.store.check([k]) for k in keys)):
            log.info("epoch %d was never formed: its step decider ends", held.record.epoch)
            self._open.pop(held.record.epoch, None)
