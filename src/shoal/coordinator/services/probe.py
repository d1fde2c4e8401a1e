"""The coordinator's network probe, a service it holds: a registered
provider's agent asks for one before it offers anything, and joins a two-rank
gloo group with the coordinator on a store opened for it alone.

The coordinator times the collectives on its own side and keeps those figures;
when the agent registers, they replace whatever link figures it states, so a
provider cannot claim a faster link than the coordinator saw. Probes are
bounded: a few at once, one per provider, each on its own thread and port,
both gone by the probe's deadline whether or not the agent ever came.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


from shoal.coordinator.errors import Conflict, Forbidden
from shoal.errors import ControlError
from shoal.elastic.link_probe import COORDINATOR_RANK, LinkFigures, exchange, probe_group
from shoal.coordinator.db.schema import AgentRow
from shoal.coordinator.db.store import Store
from shoal.coordinator.settings import CoordinatorSettings
from shoal.spec.coordinator import AgentRegistration, Preflight, ProbeRendezvous

log = logging.getLogger(__name__)
MAX_OPEN_PROBES = 4  # probes at once, all providers together
RTT_ROUNDS = 9
BANDWIDTH_ROUNDS = 3
PAYLOAD_BYTES = 4 * 2**20
KEEP_S = 600.0  # a probe's figures count for a registration this long after it
SETTLE_S = 5.0  # a registration waits this long at most for its probe's last word


@dataclass(frozen=True)
class ProbeOutcome:
    figures: LinkFigures
    at_s: float  # when it ended, on the coordinator's clock


@dataclass
class _OpenProbe:
    agent_id: str
    done: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class NetworkProbes:
    """The open probes and the figures of finished ones, keyed by (provider, agent)."""

    def __init__(self, bind: str, deadline_s: float, clock: Callable[[], float],
                 max_open: int = MAX_OPEN_PROBES) -> None:
        self.bind, self.deadline_s, self.max_open = bind, deadline_s, max_open
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, _OpenProbe] = {}  # by provider: one at a time each
        self._outcomes: dict[tuple[str, str], ProbeOutcome] = {}

    def open(self, provider: str, agent_id: str) -> ProbeRendezvous:
        """Open a probe for `provider`'s agent: a store on a fresh port, rank 0 waiting on it."""
        probe = _OpenProbe(agent_id)
        with self._lock:
            if provider in self._open:
                raise Conflict("a probe of yours is already open: join it, or ask again "
                               f"once it ends (within {2 * self.deadline_s:.0f} s)")
            if len(self._open) >= self.max_open:
                raise Conflict(f"{self.max_open} probes are running; ask again in a few seconds")
            self._open[provider] = probe  # the slot is held from here until the thread ends
        try:
            from shoal.elastic.serve import host_store

            store = host_store(self.bind, 0)
        except ControlError:
            with self._lock:
                del self._open[provider]
            raise
        plan = ProbeRendezvous(port=store.port, key=secrets.token_hex(16),
                               deadline_s=self.deadline_s, rtt_rounds=RTT_ROUNDS,
                               bandwidth_rounds=BANDWIDTH_ROUNDS, payload_bytes=PAYLOAD_BYTES)
        probe.thread = threading.Thread(target=self._serve, args=(provider, probe, store, plan),
                                        name=f"probe-{agent_id}", daemon=True)
        probe.thread.start()
        log.info("probe for agent %s of %s on %s:%d", agent_id, provider, self.bind, plan.port)
        return plan

    def _serve(self, provider: str, probe: _OpenProbe, store, plan: ProbeRendezvous) -> None:  # noqa: ANN001
        figures = LinkFigures.failed("the probe stopped on an unexpected error")
        try:
            figures = _measure(self.bind, store, plan)
        finally:  # whatever happened, the slot is freed and the outcome kept
            del store  # with the group gone, the last reference: the port closes
            now = self._clock()
            with self._lock:
                self._outcomes = {k: o for k, o in self._outcomes.items() if now - o.at_s < KEEP_S}
                self._outcomes[(provider, probe.agent_id)] = ProbeOutcome(figures, now)
                del self._open[provider]
            probe.done.set()
        if figures.collective_ok:
            log.info("probe of agent %s: %.3f ms, %.3f Gb/s", probe.agent_id, figures.rtt_ms,
                     figures.bandwidth_gbps)
        else:
            log.warning("probe of agent %s of %s failed: %s", probe.agent_id, provider,
                        figures.reason)

    def outcome(self, provider: str, agent_id: str, wait_s: float = 0.0) -> ProbeOutcome | None:
        """The last probe's outcome for this agent, waiting up to `wait_s` for one still open
        (the agent's side ends a moment before ours)."""
        with self._lock:
            probe = self._open.get(provider)
        if probe is not None and probe.agent_id == agent_id:
            probe.done.wait(wait_s)
        now = self._clock()
        with self._lock:
            found = self._outcomes.get((provider, agent_id))
        return found if found is not None and now - found.at_s < KEEP_S else None

    def running(self) -> list[threading.Thread]:
        with self._lock:
            return [p.thread for p in self._open.values() if p.thread is not None]

    def open_count(self) -> int:
        with self._lock:
            return len(self._open)


def _measure(bind: str, store, plan: ProbeRendezvous) -> LinkFigures:  # noqa: ANN001
    """Rank 0 of the probe: wait for the agent by the deadline, then run the plan."""
    import datetime

    import torch.distributed as dist

    deadline = time.monotonic() + plan.deadline_s
    # The store's waits end by the deadline too: an agent that never comes leaves
    # rank 0 waiting on it, not on gloo's half-hour default.
    try:
        store.set_timeout(datetime.timedelta(seconds=plan.deadline_s))
        group = probe_group(dist.PrefixStore(plan.key, store), COORDINATOR_RANK, bind,
                            plan.deadline_s)
        return exchange(group, COORDINATOR_RANK, plan, deadline)
    except (RuntimeError, ControlError) as error:  # gloo's and the store's errors, and ours
        return LinkFigures.failed(str(error).strip().splitlines()[0][:300])


class NetworkProbing:
    """Probes opened for providers' agents, and the devices they register measured by them."""

    def __init__(self, store: Store, settings: CoordinatorSettings, probes: NetworkProbes) -> None:
        self.store, self.settings, self.probes = store, settings, probes

    def open_probe(self, provider: str, agent_id: str) -> ProbeRendezvous:
        with self.store.read() as session:
            agent = session.get(AgentRow, agent_id)
            if agent is not None and agent.provider != provider:
                raise Forbidden(f"agent '{agent_id}' belongs to another provider")
        return self.probes.open(provider, agent_id)

    def probed_devices(self, provider: str, registration: AgentRegistration) -> tuple[Preflight, ...]:
        """The agent's devices with the link figures of this coordinator's probe in
        place of the agent's own; refused when the probe failed, or when none ran
        and the settings require one."""
        outcome = self.probes.outcome(provider, registration.agent_id, SETTLE_S)
        if outcome is None:
            if self.settings.requires_probe:
                raise Conflict(f"agent '{registration.agent_id}' has no probe on record: ask "
                               f"for one (POST /v1/agents/{registration.agent_id}/probe) and "
                               "join it, then register")
            figures = {"rtt_ms": None, "bandwidth_gbps": None}  # what it states is not taken
        elif not outcome.figures.collective_ok:
            raise Conflict(f"agent '{registration.agent_id}': the coordinator's probe did not "
                           f"complete a collective ({outcome.figures.reason}); check that the "
                           "agent's host reaches the coordinator's probe address and port "
                           "(firewall, the coordinator's --host), then run the agent again")
        else:
            figures = {"rtt_ms": outcome.figures.rtt_ms,
                       "bandwidth_gbps": outcome.figures.bandwidth_gbps}
        return tuple(Preflight.model_validate({**d.model_dump(), **figures})
                     for d in registration.devices)
