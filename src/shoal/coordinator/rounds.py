"""The coordinator's own loop: a market round, lost agents reaped, chain jobs
tended (failed settlements retried, live ones kept active), jobs whose
membership changed re-planned, disputes nobody filed rejected, every
`clear_interval_s`, on a thread of its own; old nonces forgotten and answered
challenges' files past their retention pruned every PRUNE_EVERY rounds."""

from __future__ import annotations

import logging
import threading

from shoal.coordinator.api.metrics import CoordinatorMetrics
from shoal.coordinator.service import Coordinator

log = logging.getLogger(__name__)
PRUNE_EVERY = 30  # rounds between prunes (nonces, answered files)


class RoundLoop:
    def __init__(self, coordinator: Coordinator, metrics: CoordinatorMetrics) -> None:
        self.coordinator, self.metrics = coordinator, metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shoal-rounds", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def once(self) -> None:
        lost = self.coordinator.supervision.reap_lost_agents()
        if lost:
            self.metrics.lost_agents.inc(len(lost))
            log.warning("agents lost (silent > %.1f s): %s; their leases are replaced",
                        self.coordinator.settings.agent_timeout_s, ", ".join(lost))
        clearing = self.coordinator.clear()
        self.coordinator.supervision.supervise_jobs()
        self.coordinator.chain.tend(self.coordinator.jobs.end)
        self.coordinator.planning.plan_jobs()
        self.coordinator.records.root_epochs()
        self.coordinator.plants.plant_forced_errors()
        self.coordinator.disputes.enforce_rulings()
        self.coordinator.unfiled.dismiss_unfiled_disputes()
        self.metrics.rounds.inc()
        self.metrics.leases.inc(sum(len(f.new_leases) for f in clearing.fills))
        self.metrics.notices.inc(len(clearing.notices))

    def _run(self) -> None:
        rounds = 0
        while not self._stop.wait(self.coordinator.settings.clear_interval_s):
            try:
                self.once()
                rounds += 1
                if rounds % PRUNE_EVERY == 0:
                    self.coordinator.prune_nonces()
                    self.coordinator.retention.prune()
            except Exception:  # noqa: BLE001 - one bad round must not end the coordinator's loop
                log.exception("market round failed; trying again next round")
