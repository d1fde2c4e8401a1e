"""The membership authority: the one place that decides who is in.

It numbers epochs and publishes each membership to the rendezvous store.
It drops a worker when its process is gone (its launcher, on any host,
says so at once), when it falls behind its peers' progress for longer than
a deadline derived from step times (shoal.elastic.liveness), or when it
gives notice; it admits joiners; it re-forms the same members when a step
failed without anyone leaving, and gives the run up, with a clear reason,
when re-forming keeps failing without progress. It runs beside the store,
never inside a trainer: if a trainer hosted it and died, everyone would
lose it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shoal import jsonl
from shoal.errors import ControlError
from shoal.elastic.decider import StepDecider
from shoal.elastic.failed_steps import HOLD_S, FailedSteps, GiveUp, HoldOut
from shoal.elastic.job_end import JobEnd
from shoal.elastic.liveness import LivenessConfig, ProgressWatch
from shoal.elastic.share_moves import MemberWeights
from shoal.spec.elastic import MembershipEpoch, StepDecision
from shoal.train.rendezvous import Rendezvous, connect

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuthorityConfig:
    min_workers: int = 1  # first epoch waits for this many registrations
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    # Requests and process exits wake the authority at once (notify()); without
    # them it wakes at the next fencing deadline, or this often at most.
    check_s: float = 0.05
    # A join waits this long for a fault (an exit, a stall) to publish with, so that a
    # replacement called in at a fault costs the job one new epoch, not two.
    join_batch_s: float = 0.1
    # Re-forms of the same members in a row with no step committed in between, after
    # which the run is given up instead of looping, where no member can be held out (one
    # member, or a resync); with two or more, members are held out in turn first
    # (shoal.elastic.failed_steps), each for this long.
    max_failed_reforms: int = 5
    hold_out_s: float = HOLD_S
    # The job's steps, where the host knows them (a market job's): a member's report of
    # having finished counts only at or past them. None: the members' word on when
    # they finished (a `shoal run`, whose launcher hosts the authority, trusts them).
    steps: int | None = None
    # A member a newer epoch dropped after it gave notice still votes on the step in flight
    # (then exits); if it has not this long after, the step is discarded without it (its
    # lease ended and the gate cut it off first). As long as a collective may linger.
    leaver_grace_s: float = 30.0

    def __post_init__(self) -> None:
        if self.min_workers < 1:
            raise ControlError("min_workers must be at least 1")
        if self.max_failed_reforms < 1:
            raise ControlError("max_failed_reforms must be at least 1")
        if self.steps is not None and self.steps < 1:
            raise ControlError("steps must be at least 1")


class MembershipAuthority:
    """Runs in a thread beside the store; `stop()` ends it."""

    def __init__(self, rendezvous: Rendezvous, config: AuthorityConfig,
                 process_alive: Callable[[str], bool | None] = lambda w: None,
                 event_log: Path | None = None) -> None:
        self.rdzv = rendezvous
        self.config = config
        # True/False when the caller owns the worker's process; None when it cannot tell.
        self.process_alive = process_alive
        self.event_log = event_log
        self.epoch = -1
        self.members: tuple[str, ...] = ()
        self.record: MembershipEpoch | None = None  # the newest published
        # Decides every voted step once started (tests drive `tick` alone, deciding none).
        self.decider: StepDecider | None = None
        self._reform_wanted: tuple[int, str | None] | None = None  # set by the decider
        self._shared_lock = threading.Lock()  # what the decider's threads also touch
        # Members that hold the job's state, all alike: those of the epoch of the last
        # decided step (a resync's source alone), that have been in every epoch since.
        self._holders: tuple[str, ...] = ()
        self._history: dict[int, tuple[str, ...]] = {}  # published epoch -> members
        self.weights = MemberWeights()  # each member's share weight, carried across epochs
        self.failure: str | None = None
        self._pending: list[str] = []  # registered, not yet admitted
        self._pending_since = 0.0  # when the oldest of them registered
        self._joins_seen = 0
        self._requests_seen = 0
        self._exited: set[str] = set()
        self._watch = ProgressWatch(config.liveness)
        # Steps that fail with no fault seen: who is held out next (shoal.elastic.failed_steps)
        self.failures = FailedSteps(config.max_failed_reforms, hold_s=config.hold_out_s)
        self._ending = False  # a member has finished the job: admit nobody more
        self.end = JobEnd(rendezvous, config.steps)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="membership-authority", daemon=True)
        self._watcher: threading.Thread | None = None

    def start(self, watch_requests: Rendezvous | None = None) -> MembershipAuthority:
        """Run in a thread, deciding every voted step (shoal.elastic.decider);
        `watch_requests` (a second store connection) wakes it on requests."""
        host, port = self.rdzv.store.host, self.rdzv.store.port
        self.decider = StepDecider(lambda: Rendezvous(connect(host, port)),
                                   lambda: self.record.epoch if self.record else -1,
                                   self.request_reform, self._decided)
        if self.record is not None:
            self.decider.follow(self.record)
        self._thread.start()
        if watch_requests is not None:
            self._watcher = threading.Thread(target=self._watch_requests, args=(watch_requests,),
                                             name="authority-requests", daemon=True)
            self._watcher.start()
        return self

    def request_reform(self, epoch: int, state_source: str | None = None) -> None:
        """Re-form `epoch`'s members (a step of it failed); with `state_source`, every
        other member adopts that member's state. The step decider asks it; nobody else."""
        with self._shared_lock:
            self._reform_wanted = (epoch, state_source)
        self.notify()

    def _decided(self, record: MembershipEpoch, decision: StepDecision) -> None:
        """A step of `record` was decided (the decider's thread): who holds the state now."""
        held = (decision.resync_from,) if decision.resync_from else record.members
        self.weights.decided(record.members, record.weights)
        with self._shared_lock:
            later = [m for e, m in self._history.items() if e > record.epoch]
            self._holders = tuple(h for h in held if all(h in m for m in later))
            for e in [e for e in self._history if e < record.epoch]:
                del self._history[e]

    def published_speeds(self, members: tuple[str, ...]) -> dict[str, float]:
        """`members`' speeds as the job publishes them (the coordinator holds offers to
        them): each one's own report, but a member whose claimed speed the host's clock
        refuted gets the speed its share stood at (shoal.elastic.share_moves)."""
        reported = {m: s for m, s in zip(members, self.rdzv.speeds(members)) if s}
        decider = self.decider
        return reported if decider is None else \
            decider.moves.published(self.weights.of(members), reported)

    def notify(self) -> None:
        """Something changed (a process exited, a request arrived): decide now."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.decider is not None:  # after the tick thread: they share one connection
            self.decider.stop(self.rdzv)
            # It refers back to this authority (and so to the host's store): without the
            # cycle broken, the store would serve until a garbage collection.
            self.decider = None
        if self._watcher is not None and self._watcher.is_alive():
            self.rdzv.wake_watchers()  # its wait returns; it sees the stop and ends
            self._watcher.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            now = time.monotonic()
            try:
                self.tick(now)
            except Exception:  # the authority must outlive any one bad read
                log.exception("membership authority tick failed; retrying")
            wait = self.config.check_s
            if self.members:
                wait = min(wait, max(0.005, self._watch.seconds_to_next_deadline(now)))
            self._wake.wait(wait)

    def _watch_requests(self, rdzv: Rendezvous) -> None:
        seen = 0
        while not self._stop.is_set():
            # A long wait: the store answers the moment a request lands, and a timeout
            # here only makes c10d log a warning.
            if rdzv.wait_request(seen + 1, timeout_s=3600.0):
                seen += 1
                self.notify()

    def tick(self, now: float) -> None:
        """One round: gather joins, leaves, exits, laggards and reform requests; publish if needed."""
        if self.epoch >= 0 and self.rdzv.done():
            return  # the job reached its end: members exiting now are not faults
        requests = self.rdzv.requests_seen()
        leaving: list[str] = []
        reform, source = self._take_reform()
        if self.decider is not None and self.record is not None \
                and self.decider.has_open_before(self.record.epoch):
            self.decider.discard_lost(self.rdzv, self.record, self.config.leaver_grace_s)
        if requests != self._requests_seen:  # only then is there anything to read
            self._requests_seen = requests
            self._take_joins(now)
            leaving = self.rdzv.leaving(list(self.members))
            self._exited.update(self.rdzv.exited(list(self.members) + self._pending))
        # Final reports are read only once a member's beat says it finished (the last
        # tick's reading): a read of every member's report at every request would cost
        # a round trip per member all through the job.
        if self._ending and self.end.end_if_finished(self.members, self._steps_decided()):
            return
        if self.epoch < 0:
            # A worker that died before the first epoch (registered or not) will never
            # come: wait for that many fewer, or the job would wait forever.
            arrived = [w for w in self._pending if self._alive(w)]
            needed = max(1, self.config.min_workers - self.rdzv.exit_count())
            if len(arrived) >= needed:
                self._publish(tuple(arrived), "start", now)
                self._pending = []
            return
        dropped, reasons = self._dropped(now, leaving)
        dropped, reasons = self._keep_last_holder(dropped, reasons, leaving)
        rejoining = [w for w in self._pending if w in self.members]
        if dropped or rejoining:
            survivors = tuple(m for m in self.members if m not in dropped and m not in rejoining)
            self.failures.forget(self._steps_done_now())
            self._publish(survivors + tuple(self._admit(survivors, now)),
                          ",".join(reasons) or "rejoin", now, veterans=survivors)
        elif self._pending and now - self._pending_since >= self.config.join_batch_s and \
                (admitted := self._admit(self.members, now)):
            self.failures.forget(self._steps_done_now())
            self._publish(self.members + tuple(admitted), "join", now, veterans=self.members)
        elif reform:
            self._reform(source, now)

    def _take_reform(self) -> tuple[bool, str | None]:
        """(wanted, state source): a re-form of the newest epoch the decider asked for."""
        with self._shared_lock:
            wanted, self._reform_wanted = self._reform_wanted, None
        if wanted is None or wanted[0] != self.epoch:
            return False, None  # none, or of an epoch already superseded
        return True, wanted[1]

    def _steps_done_now(self) -> int:
        """The steps done, as the decider decided them (rank 0's `progress` is its own
        word: a rank 0 that moved it would keep failing steps from ever counting as
        stuck); rank 0's word where no decider runs (tests that drive `tick`)."""
        decided = self._steps_decided()
        return self.rdzv.progress() if decided is None else decided

    def _steps_decided(self) -> int | None:
        return self.decider.steps_decided if self.decider is not None else None

    def _keep_last_holder(self, dropped: set[str], reasons: list[str],
                          leaving: list[str]) -> tuple[set[str], list[str]]:
        """When every member leaves at once (a paused job's leases all end, or one is lost
        while the last leaves), one leaver stays a member for one more step boundary:
        alone, it writes the checkpoint whoever comes next restores from; with joiners
        waiting, it forms the next epoch with them, so they take its live state (joiners
        alone would start from their own disks, which hold nothing of this job)."""
        alive_leavers = [m for m in self.members if m in leaving and self._alive(m)]
        if alive_leavers and dropped >= set(self.members):
            kept = alive_leavers[0]
            return dropped - {kept}, [r for r in reasons if r != f"leave:{kept}"] + [f"holds-state:{kept}"]
        return dropped, reasons

    def _reform(self, source: str | None, now: float) -> None:
        """A step failed with no fault seen: the same members again, or (when that keeps
        failing) without one member in turn; give the run up when nothing commits."""
        steps = self._steps_done_now()
        then = self.failures.failed(self.members, steps, now, hold_out=source is None)
        if isinstance(then, GiveUp):
            self.failure = (f"{then.reason}; see the worker logs (a collective timeout too short "
                            "for the step, or a network path that drops traffic between workers)")
            log.error("giving the run up: %s", self.failure)
            self.rdzv.mark_failed(self.failure)
            self._stop.set()
            return
        if isinstance(then, HoldOut):
            log.warning("step %d keeps failing with no fault seen: %s is held out for %.0f s",
                        steps, then.out, self.config.hold_out_s)
            # The member held out before is back in: its join request is answered (taken
            # as a rejoin, it would re-form the group once more for nothing).
            self._pending = [w for w in self._pending if w not in then.members]
            self._publish(then.members, f"hold-out:{then.out}", now,
                          veterans=tuple(m for m in self.members if m in then.members))
            return
        self._publish(self.members, "resync" if source else "reform", now, state_source=source,
                      veterans=self.members)

    def _take_joins(self, now: float) -> None:
        self._joins_seen, joined = self.rdzv.joins_since(self._joins_seen)
        if joined and not self._pending:
            self._pending_since = now
        for worker in joined:
            if worker not in self._pending:
                # A member that registers again (fenced, then woke up) is re-admitted fresh.
                self._pending.append(worker)

    def _admit(self, current: tuple[str, ...], now: float) -> list[str]:
        """The pending joiners to admit now; one held out stays pending until its time."""
        if self._ending:  # a joiner now would wait for members that have finished
            return []
        held = [w for w in self._pending if self.failures.holds(w, now)]
        admitted = [w for w in self._pending if w not in current and w not in held
                    and self._alive(w)]
        self._pending = held
        return admitted

    def _alive(self, worker: str) -> bool:
        return worker not in self._exited and self.process_alive(worker) is not False

    def _dropped(self, now: float, leaving: list[str]) -> tuple[set[str], list[str]]:
        dropped, reasons = set(), []
        beats = self.rdzv.beats(list(self.members)) if self.members else {}
        # A member that finished the job exits, and beats no more: neither is a fault.
        finished = self.end.finished(self.members, beats, self._steps_decided())
        self._ending = bool(finished)
        for worker in self.members:
            if worker in finished:
                continue
            if not self._alive(worker):
                dropped.add(worker)
                reasons.append(f"exit:{worker}")
        for worker in leaving:
            if worker not in dropped:
                dropped.add(worker)
                reasons.append(f"leave:{worker}")
        if self.members:
            # No member's beat counts past the votes decided here (unknown: its word).
            decided = self.decider.votes_decided if self.decider else lambda epoch: None
            for worker in self._watch.laggards(beats, now, decided):
                if worker not in dropped and worker not in finished:
                    dropped.add(worker)
                    reasons.append(f"stall:{worker}")
        return dropped, reasons

    def _publish(self, members: tuple[str, ...], reason: str, now: float,
                 state_source: str | None = None, veterans: tuple[str, ...] = ()) -> None:
        self.members = members
        if not members:
            log.warning("no workers left (%s); waiting for joiners", reason)
            return
        self.epoch += 1
        with self._shared_lock:
            self._history[self.epoch] = members
            self._holders = tuple(h for h in self._holders if h in members)
            holder = None if state_source else next((m for m in members if m in self._holders),
                                                    None)
        record = MembershipEpoch(epoch=self.epoch, members=members,
                                 weights=self.weights.for_epoch(members),
                                 reason=reason, state_source=state_source, state_holder=holder)
        self._watch.reset(self.epoch, now, veterans)
        entry = {"t": time.time(), "epoch": self.epoch, "members": list(members), "reason": reason}
        if state_source or holder:  # a chain break at the epoch's start falls on it
            entry["state_source"] = state_source or holder  # (shoal.proof.chain)
        # Logged before it is published: the coordinator holds work records to this log, and
        # a member can commit a step in the epoch (and upload its record) only once published.
        if self.event_log is not None:
            jsonl.append(self.event_log, json.dumps(entry))
        self.rdzv.publish_epoch(record)
        self.record = record
        if self.decider is not None:
            self.decider.follow(record)
            # A member dropped without notice will not vote: its old epoch's step in
            # flight is discarded now, not at the next tick.
            self.decider.discard_lost(self.rdzv, record, self.config.leaver_grace_s)
        log.info("epoch %d: %d members %s (%s)", self.epoch, len(members), list(members), reason)
