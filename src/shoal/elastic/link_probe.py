"""The collectives of a network probe, run alike by the coordinator (rank 0) and
an agent (rank 1) in a two-rank gloo group: what the link between them does,
measured by the backend the workers will use, not by a ping.

A one-float all-reduce is timed for the round trip, a payload of a few MiB for
bandwidth, and each payload must come back summed exactly, so a peer that does
not really send its share fails. Last, rank 0 tells rank 1 what it measured:
the figures an agent may publish are the coordinator's own.
"""

from __future__ import annotations

import datetime
import statistics
import time
from dataclasses import dataclass

from shoal.errors import ControlError
from shoal.spec.coordinator import ProbeRendezvous

COORDINATOR_RANK, AGENT_RANK = 0, 1


class ProbeFailed(ControlError):
    """The probe's collectives did not complete, or completed wrong."""


@dataclass(frozen=True)
class LinkFigures:
    """One probe's outcome, as one side saw it."""

    collective_ok: bool
    rtt_ms: float | None = None
    bandwidth_gbps: float | None = None
    reason: str | None = None  # why the collective failed, for the log

    @classmethod
    def failed(cls, reason: str) -> LinkFigures:
        return cls(collective_ok=False, reason=reason)


def probe_group(store, rank: int, address: str, timeout_s: float):  # noqa: ANN001, ANN201
    """A two-rank gloo group on `store`, its sockets on `address` (gloo would
    otherwise advertise the address its hostname resolves to, which across
    hosts or network namespaces the peer may not reach)."""
    import torch.distributed as dist

    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    options._timeout = datetime.timedelta(seconds=max(timeout_s, 0.1))
    return dist.ProcessGroupGloo(store, rank, 2, options)


def exchange(group, rank: int, plan: ProbeRendezvous, deadline: float) -> LinkFigures:  # noqa: ANN001
    """Run the plan's collectives as `rank`; raises ProbeFailed past `deadline`
    (time.monotonic) or on a wrong sum, RuntimeError when gloo fails."""
    import torch

    _timed(group, torch.zeros(1), deadline)  # the first collective pays for setup
    rtts = [_timed(group, torch.ones(1), deadline) for _ in range(plan.rtt_rounds)]
    # Rank 0 sends ones, rank 1 twos: a sum of anything but threes is a peer that cheated.
    mine = torch.full((plan.payload_bytes // 4,), float(rank + 1), dtype=torch.float32)
    times = []
    for _ in range(plan.bandwidth_rounds):
        payload = mine.clone()
        times.append(_timed(group, payload, deadline))
        if not bool((payload == 3.0).all()):
            raise ProbeFailed("the payload all-reduce came back with a wrong sum")
    rtt_ms = statistics.median(rtts) * 1e3
    gbps = plan.payload_bytes * 8 / statistics.median(times) / 1e9
    told = torch.tensor([rtt_ms, gbps] if rank == COORDINATOR_RANK else [0.0, 0.0],
                        dtype=torch.float64)
    _timed(group, told, deadline)
    if rank != COORDINATOR_RANK:
        rtt_ms, gbps = float(told[0]), float(told[1])
        if not (0.0 < rtt_ms <= 600_000.0 and 0.0 < gbps <= 10_000.0):
            raise ProbeFailed(f"the coordinator told figures out of range ({rtt_ms}, {gbps})")
    return LinkFigures(collective_ok=True, rtt_ms=round(rtt_ms, 4), bandwidth_gbps=round(gbps, 4))


def _timed(group, tensor, deadline: float) -> float:  # noqa: ANN001
    if time.monotonic() > deadline:
        raise ProbeFailed("the probe ran past its deadline")
    start = time.perf_counter()
    group.allreduce([tensor]).wait()
    return time.perf_counter() - start
