"""Liveness as progress: the worker reports each progress point it reaches.

The training thread only records the point (arrived at an epoch, entered
a step's exchange, voted), and, while it waits on peers, refreshes it every
`refresh_s`; a thread with its own store connection writes it, so
reporting costs the step no round trip. A worker hung in its data
loader or a device wait reaches no new point, and the authority sees it
fall behind its peers (shoal.elastic.liveness) whether or not its
process still runs.

The same thread writes the worker's other reports that nobody waits for
(its measured speed; the job's step count, on rank 0): on a link with a
100 ms round trip, a blocking write per step would cost more than a DiLoCo
inner step's compute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from shoal.spec.elastic import Phase, ProgressBeat
from shoal.train.rendezvous import Rendezvous

log = logging.getLogger(__name__)
# The least time between two beats: a step reaches two or three progress points, and at a
# few ms a step each was a store round trip (through a market job's gate, two more
# relays). The liveness deadline is never under 100 ms (`--stall-deadline-s`'s least), and
# 0.25 s more than three step times (shoal.elastic.liveness): a point seen this late
# changes no verdict.
BEAT_GAP_S = 0.05


class ProgressReporter:
    def __init__(self, worker: str, connect: Callable[[], Rendezvous],
                 refresh_s: float = 0.25, gap_s: float = BEAT_GAP_S) -> None:
        self.worker = worker
        self.refresh_s = refresh_s
        self.gap_s = gap_s
        self._point: ProgressBeat | None = None
        self._refreshed_at = 0.0
        self._connect = connect
        self._epoch, self._count, self._vote = -1, 0, 0
        self._latest: ProgressBeat | None = None
        self._reports: dict[str, Callable[[Rendezvous], Any]] = {}  # the newest of each kind
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, name="progress", daemon=True)
        self._thread.start()

    def reached(self, epoch: int, step: int, phase: Phase) -> None:
        """Record a progress point; the count restarts with every epoch."""
        with self._lock:
            if epoch != self._epoch:
                self._epoch, self._count, self._vote = epoch, 0, 0
            self._count += 1
            self._point = ProgressBeat(epoch=epoch, count=self._count, step=step, phase=phase,
                                       vote=self._vote)
            if phase is Phase.voted:  # what it reaches next is on the way to the next vote
                self._vote += 1
            self._latest, self._refreshed_at = self._point, time.monotonic()
        self._wake.set()

    def waiting(self) -> None:
        """Still at the last point, waiting on peers: refresh it (at most every refresh_s)."""
        now = time.monotonic()
        if self._point is None or now - self._refreshed_at < self.refresh_s:
            return
        with self._lock:
            self._point = self._point.model_copy(update={"waits": self._point.waits + 1})
            self._latest, self._refreshed_at = self._point, now
        self._wake.set()

    def report_speed(self, worker: str, samples_per_s: float) -> None:
        """Publish this worker's measured speed (for share balancing), in the background."""
        self._later("speed", lambda rdzv: rdzv.report_speed(worker, samples_per_s))

    def report_progress(self, step: int) -> None:
        """Publish the job's committed step count (rank 0), in the background."""
        self._later("progress", lambda rdzv: rdzv.report_progress(step))

    def _later(self, kind: str, write: Callable[[Rendezvous], Any]) -> None:
        with self._lock:
            self._reports[kind] = write  # an older report of the same kind is moot
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def _write(self) -> None:
        rdzv = self._connect()
        rtt_s = rdzv.round_trip_s()  # the store measured from here, once, for the authority
        beaten_at = -self.gap_s
        while True:
            pending = self._latest is not None
            self._wake.wait(max(0.0, beaten_at + self.gap_s - time.monotonic()) if pending
                            else None)
            self._wake.clear()
            stopping = self._stop.is_set()
            with self._lock:
                beat = None
                # Reports go at once (chaos by step reads `progress`); a beat waits out the
                # gap since the last one, and only the newest point is written. The last
                # one goes whatever the gap.
                if self._latest is not None and (
                        stopping or time.monotonic() >= beaten_at + self.gap_s):
                    beat, self._latest = self._latest, None
                reports, self._reports = list(self._reports.values()), {}
            writes = list(reports)
            if beat is not None:
                beaten_at = time.monotonic()
                writes.insert(0, lambda r, b=beat.model_copy(update={"rtt_s": rtt_s}):
                              r.beat(self.worker, b))
            for write in writes:
                try:
                    write(rdzv)
                except (RuntimeError, OSError) as error:  # the store is down or unreachable
                    log.debug("progress report failed: %s", error)
            if stopping:
                return
