"""An agent's pre-flight: what its device and its link really do, measured
before it is offered, so an offer's figures are measurements and not claims.

Speed is samples per second of a fixed probe (a small MLP's forward and
backward at batch 32), divided by `slowdown` when one machine poses as a
slower provider; memory is this machine's, shared by its devices; the link
is the coordinator's probe: a two-rank gloo group with the coordinator, whose
round trip and bandwidth the coordinator times and tells back (link_probe.py).
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from urllib.parse import urlsplit

from pydantic import ValidationError

from shoal.client.http import CoordinatorClient, CoordinatorRefused
from shoal.errors import ControlError
from shoal.elastic.link_probe import AGENT_RANK, LinkFigures, exchange, probe_group
from shoal.elastic.netaddr import address_towards
from shoal.agent.environments import provider_torch
from shoal.spec.coordinator import Backend, Preflight, ProbeRendezvous

log = logging.getLogger(__name__)
PROBE_BATCH = 32
PROBE_S = 0.5
PROBE_TIMEOUT_S = 60.0  # the most an agent waits on a probe, whatever the coordinator says


def measure_speed(slowdown: float = 1.0, probe_s: float = PROBE_S) -> float:
    """Samples per second of the probe on this CPU (the median of three timings)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256))
    batch = torch.randn(PROBE_BATCH, 256)
    rates = []
    for _ in range(3):
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < probe_s / 3:
            model.zero_grad()
            model(batch).square().mean().backward()
            steps += 1
        rates.append(steps * PROBE_BATCH / (time.perf_counter() - start))
    return sorted(rates)[1] / slowdown


def memory_gb(devices: int) -> float:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return round(total / 2**30 / max(1, devices), 2)


def probe_link(client: CoordinatorClient, agent_id: str,
               timeout_s: float = PROBE_TIMEOUT_S) -> LinkFigures:
    """Join the coordinator's probe for `agent_id`; a failure is an outcome, not an error.

    Trusting the coordinator no further than needed: the group is joined on the
    host this agent already calls it at (never a host the reply names), at the
    port the reply names, and the plan's sizes are bounded by ProbeRendezvous.
    """
    try:
        plan = _ask_for_probe(client, agent_id, time.monotonic() + timeout_s)
    except (ControlError, ValidationError) as error:
        return LinkFigures.failed(f"the coordinator opened no probe: {error}")
    host = urlsplit(client.url).hostname or "127.0.0.1"
    wait_s = min(plan.deadline_s, timeout_s)
    deadline = time.monotonic() + wait_s
    try:
        import torch.distributed as dist

        local = address_towards(host, plan.port)
        store = dist.TCPStore(host, plan.port, is_master=False,
                              timeout=datetime.timedelta(seconds=wait_s))
        group = probe_group(dist.PrefixStore(plan.key, store), AGENT_RANK, local, wait_s)
        return exchange(group, AGENT_RANK, plan, deadline)
    except (RuntimeError, ControlError) as error:  # gloo's and the store's errors, and ours
        return LinkFigures.failed(f"{host}:{plan.port}: {str(error).strip().splitlines()[0][:300]}")


def _ask_for_probe(client: CoordinatorClient, agent_id: str, deadline: float) -> ProbeRendezvous:
    """The coordinator runs a few probes at a time: while it is busy (409), ask again."""
    wait_s = 0.5
    while True:
        try:
            return ProbeRendezvous.model_validate(
                client.request("POST", f"/v1/agents/{agent_id}/probe"))
        except CoordinatorRefused as refused:
            if refused.status != 409 or time.monotonic() + wait_s > deadline:
                raise
            log.info("the coordinator's probes are busy (%s); asking again in %.1f s",
                     refused.detail, wait_s)
        time.sleep(wait_s)
        wait_s = min(2 * wait_s, 4.0)


def preflight(client: CoordinatorClient, agent_id: str, devices: int, device_kind: str,
              slowdown: float = 1.0) -> tuple[Preflight, ...]:
    """Measure this machine and its link to the coordinator (its agent must be
    registered as a provider: the probe is a signed request)."""
    speed, memory = measure_speed(slowdown), memory_gb(devices)
    link = probe_link(client, agent_id)
    if not link.collective_ok:
        log.error("pre-flight: no collective with the coordinator's probe (%s). Check that this "
                  "host reaches the coordinator's host on TCP (a firewall between them?) and "
                  "that the coordinator binds an address this host can reach (its --host, or "
                  "SHOAL_COORDINATOR_RENDEZVOUS_BIND)", link.reason)
    return tuple(Preflight(device_kind=device_kind, speed_samples_per_s=round(speed, 2),
                           memory_gb=memory, backend=Backend.gloo, torch=provider_torch(),
                           collective_ok=link.collective_ok,
                           rtt_ms=link.rtt_ms, bandwidth_gbps=link.bandwidth_gbps)
                 for _ in range(devices))
