"""An agent's pre-flight: what its device really does, measured before it is
offered, so an offer's speed is a measurement and not a claim.

Speed is samples per second of a fixed probe (a small MLP's forward and
backward at batch 32), divided by `slowdown` when one machine poses as a
slower provider; memory is this machine's, shared by its devices; the
collective is a real two-rank gloo all-reduce over loopback.
"""

from __future__ import annotations

import datetime
import os
import threading
import time

from shoal.spec.coordinator import Backend, Preflight

PROBE_BATCH = 32
PROBE_S = 0.5


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


def collective_ok(timeout_s: float = 20.0) -> bool:
    """A two-rank gloo all-reduce over loopback: the backend the workers will use works."""
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    results: list[float] = [0.0, 0.0]

    def rank(index: int) -> None:
        # Each rank its own store connection: one client's blocking wait would stall the other.
        client = dist.TCPStore("127.0.0.1", store.port, is_master=False,
                               timeout=datetime.timedelta(seconds=timeout_s))
        group = dist.ProcessGroupGloo(dist.PrefixStore("preflight", client), index, 2,
                                      datetime.timedelta(seconds=timeout_s))
        tensor = torch.tensor([float(index + 1)])
        group.allreduce([tensor]).wait()
        results[index] = float(tensor.item())

    threads = [threading.Thread(target=rank, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    return results == [3.0, 3.0]


def preflight(devices: int, device_kind: str, slowdown: float = 1.0) -> tuple[Preflight, ...]:
    speed, memory, works = measure_speed(slowdown), memory_gb(devices), collective_ok()
    return tuple(Preflight(device_kind=device_kind, speed_samples_per_s=round(speed, 2),
                           memory_gb=memory, backend=Backend.gloo, collective_ok=works)
                 for _ in range(devices))
