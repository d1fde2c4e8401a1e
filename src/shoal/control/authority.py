"""The membership authority: the one place that decides who is in.

It numbers epochs and publishes each membership to the rendezvous store.
It drops a worker when its process is gone (the launcher tells it at
once), when its heartbeat stops for longer than the stall deadline, or
when it asks to leave; it admits joiners; and it re-forms the same members
when a step failed without anyone leaving. It runs beside the store, never
inside a trainer: if a trainer hosted it and died, everyone would lose it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shoal.spec.elastic import MembershipEpoch
from shoal.train.rendezvous import Rendezvous

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuthorityConfig:
    min_workers: int = 1  # first epoch waits for this many registrations
    stall_deadline_s: float = 3.0  # heartbeat silence after which a worker is dropped
    # Requests and process exits wake the authority at once (notify()); without
    # them it wakes this often, to check heartbeats.
    heartbeat_check_s: float = 0.25

    def __post_init__(self) -> None:
        if self.min_workers < 1:
            raise ValueError("min_workers must be at least 1")
        if self.stall_deadline_s <= 0:
            raise ValueError("stall_deadline_s must be positive")


@dataclass
class _Liveness:
    """When the authority last saw each member's heartbeat value change (its own clock)."""

    values: dict[str, bytes | None] = field(default_factory=dict)
    changed_at: dict[str, float] = field(default_factory=dict)

    def observe(self, worker: str, value: bytes | None, now: float) -> None:
        if worker not in self.changed_at or value != self.values.get(worker):
            self.values[worker], self.changed_at[worker] = value, now

    def silent_for(self, worker: str, now: float) -> float:
        return now - self.changed_at.get(worker, now)


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
        self._pending: list[str] = []  # registered, not yet admitted
        self._joins_seen = 0
        self._requests_seen = 0
        self._liveness = _Liveness()
        self._last_heartbeat_check = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="membership-authority", daemon=True)

    def start(self, watch_requests: Rendezvous | None = None) -> MembershipAuthority:
        """Run in a thread; `watch_requests` (a second store connection) wakes it on requests."""
        self._thread.start()
        if watch_requests is not None:
            threading.Thread(target=self._watch_requests, args=(watch_requests,),
                             name="authority-requests", daemon=True).start()
        return self

    def notify(self) -> None:
        """Something changed (a process exited, a request arrived): decide now."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.tick(time.monotonic())
            except Exception:  # the authority must outlive any one bad read
                log.exception("membership authority tick failed; retrying")
            self._wake.wait(self.config.heartbeat_check_s)

    def _watch_requests(self, rdzv: Rendezvous) -> None:
        seen = 0
        while not self._stop.is_set():
            # A long wait: the store answers the moment a request lands, and a timeout
            # here only makes c10d log a warning.
            if rdzv.wait_request(seen + 1, timeout_s=3600.0):
                seen += 1
                self.notify()

    def tick(self, now: float) -> None:
        """One round: gather joins, leaves, exits, stalls and reform requests; publish if needed."""
        requests = self.rdzv.requests_seen()
        leaving: list[str] = []
        reform = False
        if requests != self._requests_seen:  # only then is there anything to read
            self._requests_seen = requests
            self._take_joins(now)
            leaving = self.rdzv.leaving(list(self.members))
            reform = self.epoch >= 0 and self.rdzv.reform_requested(self.epoch)
        if self.epoch < 0:
            if len(self._pending) >= self.config.min_workers:
                self._publish(tuple(self._pending), "start")
                self._pending = []
            return
        dropped, reasons = self._dropped(now, leaving)
        rejoining = [w for w in self._pending if w in self.members]
        if dropped or rejoining:
            survivors = tuple(m for m in self.members if m not in dropped and m not in rejoining)
            self._publish(survivors + tuple(self._admit(survivors)), ",".join(reasons) or "rejoin")
        elif self._pending:
            self._publish(self.members + tuple(self._admit(self.members)), "join")
        elif reform:
            self._publish(self.members, "reform")

    def _take_joins(self, now: float) -> None:
        self._joins_seen, joined = self.rdzv.joins_since(self._joins_seen)
        for worker in joined:
            if worker not in self._pending:
                # A member that registers again (fenced, then woke up) is re-admitted fresh.
                self._pending.append(worker)
                self._liveness.observe(worker, None, now)

    def _admit(self, current: tuple[str, ...]) -> list[str]:
        admitted = [w for w in self._pending if w not in current and self.process_alive(w) is not False]
        self._pending = []
        return admitted

    def _dropped(self, now: float, leaving: list[str]) -> tuple[set[str], list[str]]:
        dropped, reasons = set(), []
        for worker in self.members:
            if self.process_alive(worker) is False:
                dropped.add(worker)
                reasons.append(f"exit:{worker}")
        for worker in leaving:
            if worker not in dropped:
                dropped.add(worker)
                reasons.append(f"leave:{worker}")
        if now - self._last_heartbeat_check >= self.config.heartbeat_check_s and self.members:
            self._last_heartbeat_check = now
            for worker, value in self.rdzv.heartbeats(list(self.members)).items():
                self._liveness.observe(worker, value, now)
                if worker not in dropped and self._liveness.silent_for(worker, now) > self.config.stall_deadline_s:
                    dropped.add(worker)
                    reasons.append(f"stall:{worker}")
        return dropped, reasons

    def _publish(self, members: tuple[str, ...], reason: str) -> None:
        self.members = members
        if not members:
            log.warning("no workers left (%s); waiting for joiners", reason)
            return
        self.epoch += 1
        record = MembershipEpoch(epoch=self.epoch, members=members,
                                 weights=self._weights(members), reason=reason)
        self.rdzv.publish_epoch(record)
        entry = {"t": time.time(), "epoch": self.epoch, "members": list(members), "reason": reason}
        log.info("epoch %d: %d members %s (%s)", self.epoch, len(members), list(members), reason)
        if self.event_log is not None:
            with open(self.event_log, "a") as handle:
                handle.write(json.dumps(entry) + "\n")

    def _weights(self, members: tuple[str, ...]) -> tuple[float, ...]:
        """Shares by measured speed; a newcomer gets the mean of the known speeds."""
        speeds = self.rdzv.speeds(members)
        known = [s for s in speeds if s]
        default = sum(known) / len(known) if known else 1.0
        return tuple(s if s else default for s in speeds)
