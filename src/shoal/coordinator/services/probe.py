"""The coordinator's network probe, a service it holds: a registered
provider's agent asks for one before it offers anything, and joins a two-rank
gloo group with the coordinator on a store opened for it alone.

The coordinator times the collectives on its own side and keeps those figures;
when the agent registers, they replace whatever link figures it states, so a
provider cannot claim a faster link than the coordinator saw. Probes are
bounded: a few at once, one per provider, each on its own thread and port,
both gone by the probe's deadline whether or not the agent ever came.

The few slots are shared so that asking again and again cannot keep them: a
provider (or client address) that had a probe in the last `RECENT_S` may take
only the slots beyond `RESERVED_FOR_NEW`, which wait for agents not probed
lately, and a provider whose probes failed `MAX_FAILED` times in that span
(none joined, a wrong sum) is refused until it passes.
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
RESERVED_FOR_NEW = 2  # of those, the slots only a provider and address not probed lately take
RECENT_S = 600.0  # "lately": a probe opened this long ago still counts
MAX_FAILED = 3  # failed probes a provider may have in RECENT_S before it is refused more
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


Measure = Callable[[str, object, ProbeRendezvous], LinkFigures]  # (bind, store, plan)


class NetworkProbes:
    """The open probes and the figures of finished ones, keyed by (provider, agent)."""

    def __init__(self, bind: str, deadline_s: float, clock: Callable[[], float],
                 max_open: int = MAX_OPEN_PROBES, reserved_for_new: int = RESERVED_FOR_NEW,
                 measure: Measure | None = None) -> None:
        """`measure`: rank 0's side of a probe (a test's stand-in for the real one)."""
        self.bind, self.deadline_s, self.max_open = bind, deadline_s, max_open
        self.reserved_for_new = min(reserved_for_new, max_open - 1)
        self._clock, self._measure = clock, measure or _measure
        self._lock = threading.Lock()
        self._open: dict[str, _OpenProbe] = {}  # by provider: one at a time each
        self._outcomes: dict[tuple[str, str], ProbeOutcome] = {}
        self._opened: dict[str, float] = {}  # provider or client address -> its last probe
        self._failed: dict[str, list[float]] = {}  # provider -> when its probes failed

    def open(self, provider: str, agent_id: str, client: str | None = None) -> ProbeRendezvous:
        """Open a probe for `provider`'s agent, asked from address `client`: a store on a
        fresh port, rank 0 waiting on it."""
        probe = _OpenProbe(agent_id)
        with self._lock:
            self._take_slot(provider, client, self._clock())
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

    def _take_slot(self, provider: str, client: str | None, now: float) -> None:
        """Refuse (Conflict) unless `provider` may open a probe now; else note it opened."""
        self._opened = {k: at for k, at in self._opened.items() if now - at < RECENT_S}
        self._failed = {k: kept for k, times in self._failed.items()
                        if (kept := [at for at in times if now - at < RECENT_S])}
        failed = self._failed.get(provider, [])
        if provider in self._open:
            raise Conflict("a probe of yours is already open: join it, or ask again "
                           f"once it ends (within {2 * self.deadline_s:.0f} s)")
        if len(failed) >= MAX_FAILED:
            raise Conflict(f"{len(failed)} of your probes failed in the last {RECENT_S:.0f} s "
                           "(the agent never joined, or sent wrong sums): make sure the "
                           f"agent's host reaches {self.bind} (firewall, the coordinator's "
                           f"--host), then ask again in {failed[0] + RECENT_S - now:.0f} s")
        # Who had a probe lately leaves the reserved slots to agents not probed yet.
        returning = provider in self._opened or client in self._opened
        room = self.max_open - (self.reserved_for_new if returning else 0)
        if len(self._open) >= room:
            whose = "probes are running" if not returning else \
                f"probes are running; {self.reserved_for_new} wait for agents not probed lately"
            raise Conflict(f"{len(self._open)} {whose}; ask again in a few seconds")
        self._opened[provider] = now
        if client is not None:
            self._opened[client] = now

    def _serve(self, provider: str, probe: _OpenProbe, store, plan: ProbeRendezvous) -> None:  # noqa: ANN001
        figures = LinkFigures.failed("the probe stopped on an unexpected error")
        try:
            figures = self._measure(self.bind, store, plan)
        finally:  # whatever happened, the slot is freed and the outcome kept
            del store  # with the group gone, the last reference: the port closes
            now = self._clock()
            with self._lock:
                self._outcomes = {k: o for k, o in self._outcomes.items() if now - o.at_s < KEEP_S}
                self._outcomes[(provider, probe.agent_id)] = ProbeOutcome(figures, now)
                if not figures.collective_ok:
                    self._failed.setdefault(provider, []).append(now)
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

    def open_probe(self, provider: str, agent_id: str,
                   client: str | None = None) -> ProbeRendezvous:
        """A probe for `provider`'s agent, asked from client address `client`."""
        with self.store.read() as session:
            agent = session.get(AgentRow, agent_id)
            if agent is not None and agent.provider != provider:
                raise Forbidden(f"agent '{agent_id}' belongs to another provider")
        return self.probes.open(provider, agent_id, client)

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
