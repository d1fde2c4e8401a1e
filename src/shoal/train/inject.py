"""Faults injected from inside a worker, for tests and rehearsals of what
signals cannot reach: SHOAL_INJECT is a comma-separated list of

    die-sending-state@WORKER        exit while sending live state to a joiner
    die-sending-state@once          the first worker (of those given it) that sends state dies
    nan-loss@WORKER:stepN[-M]       make this worker's loss NaN at step N (to M)
    hang@WORKER:stepN:S             hang S seconds before computing step N, alive (a stuck
                                    data loader or device wait; signals cannot fake that)
    diverge@WORKER:stepN            perturb this worker's parameters before step N
    exchange-delay:S                every DiLoCo outer exchange takes at least S seconds, on
                                    every worker (a slow link that the votes' few bytes do
                                    not queue behind, as they would in one FIFO queue)
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time

import torch

log = logging.getLogger(__name__)


def _entries() -> tuple[str, ...]:
    return _parse(os.environ.get("SHOAL_INJECT", ""))


@functools.lru_cache(maxsize=4)
def _parse(text: str) -> tuple[str, ...]:
    """Parsed once per value: the hooks run on every step and micro-batch."""
    return tuple(e.strip() for e in text.split(",") if e.strip())


def die_sending_state(worker: str, step: int) -> bool:
    # Only live state (step > 0): the first broadcast of a fresh start is not a hand-over.
    if step == 0:
        return False
    entries = _entries()
    if f"die-sending-state@{worker}" in entries:
        return True
    return "die-sending-state@once" in entries and _first_to_claim("die-sending-state")


def _first_to_claim(name: str) -> bool:
    """True for the first process of the run to claim `name` (a marker in the run directory)."""
    run_dir = os.environ.get("SHOAL_RUN_DIR")
    if not run_dir:
        return True
    try:
        os.close(os.open(os.path.join(run_dir, f"injected-{name}"), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def _steps(name: str, worker: str) -> list[tuple[int, int, str]]:
    """(first step, last step, rest) of each `name@worker:stepN[-M][:rest]` entry."""
    pattern = re.compile(rf"^{name}@{re.escape(worker)}:step(\d+)(?:-(\d+))?(?::(.*))?$")
    found = []
    for entry in _entries():
        match = pattern.match(entry)
        if match:
            first = int(match[1])
            found.append((first, int(match[2] or first), match[3] or ""))
    return found


def nan_loss(worker: str, step: int) -> bool:
    return any(first <= step <= last for first, last, _ in _steps("nan-loss", worker))


def hang_s(worker: str, step: int) -> float:
    """Seconds to hang before computing `step` (once per process)."""
    for first, _, seconds in _steps("hang", worker):
        if step == first and _first_to_claim(f"hang-{worker}-{step}"):
            return float(seconds or 10)
    return 0.0


def diverge(worker: str, step: int) -> bool:
    return any(first == step for first, _, _ in _steps("diverge", worker)) and \
        _first_to_claim(f"diverge-{worker}-{step}")


def exchange_delay_s() -> float:
    for entry in _entries():
        if entry.startswith("exchange-delay:"):
            return float(entry.split(":", 1)[1])
    return 0.0


def worker_faults(worker: str, step: int, params: list[torch.Tensor]) -> None:
    """Before computing `step`: the faults only the worker itself can cause."""
    seconds = hang_s(worker, step)
    if seconds:
        log.warning("injected fault: hanging %.1f s before step %d", seconds, step)
        time.sleep(seconds)
    if diverge(worker, step):
        log.warning("injected fault: perturbing parameters before step %d", step)
        with torch.no_grad():
            for p in params:
                p.add_(1e-3)
