"""Faults injected from inside a worker, for tests and rehearsals of what
signals cannot reach: SHOAL_INJECT is a comma-separated list of

    die-sending-state@WORKER        exit while sending live state to a joiner
    die-sending-state@once          the first worker (of those given it) that sends state dies
    nan-loss@WORKER:stepN           make this worker's loss NaN at step N
"""

from __future__ import annotations

import os


def _entries() -> list[str]:
    return [e.strip() for e in os.environ.get("SHOAL_INJECT", "").split(",") if e.strip()]


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


def nan_loss(worker: str, step: int) -> bool:
    return f"nan-loss@{worker}:step{step}" in _entries()
