"""Faults injected from inside a worker, for tests and rehearsals of what
signals cannot reach. The run config's `inject` (`RunConfig.inject`) is a
comma-separated list of

    die-sending-state@WORKER        exit while sending live state to a joiner
    die-sending-state@once          the first worker (of those given it) that sends state dies
    nan-loss@WORKER:stepN[-M]       make this worker's loss NaN at step N (to M)
    hang@WORKER:stepN:S             hang S seconds before computing step N, alive (a stuck
                                    data loader or device wait; signals cannot fake that)
    diverge@WORKER:stepN            perturb this worker's parameters before step N
    withhold@WORKER:stepN[-M]       withhold this worker's part of the exchange of step N
                                    (to M), at every try, while it keeps beating: its peers
                                    wait in the collective until it times out
    exchange-delay:S                every DiLoCo outer exchange takes at least S seconds, on
                                    every worker (a slow link that the votes' few bytes do
                                    not queue behind, as they would in one FIFO queue)

parsed once into this worker's `InjectedFaults`, which the run hands to the
parts where each fault acts (its loop, its membership, its sync).
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepFault:
    """One `name@WORKER:stepN[-M][:rest]` entry of this worker."""

    first: int
    last: int
    rest: str  # what follows the steps (a hang's seconds), "" if nothing


@dataclass(frozen=True)
class InjectedFaults:
    """The faults one worker injects; the default injects none."""

    worker: str = ""
    die_sending_state: bool = False  # exit while sending live state (step > 0)
    die_sending_state_once: bool = False  # the same, for the first worker to claim it
    nan_loss: tuple[StepFault, ...] = ()
    hang: tuple[StepFault, ...] = ()
    diverge: tuple[StepFault, ...] = ()
    withhold: tuple[StepFault, ...] = ()
    exchange_delay_s: float = 0.0  # every DiLoCo outer exchange takes at least this long
    # Markers of once-only faults go here, so that each fires in one process of the run.
    claims_dir: Path | None = None

    @classmethod
    def parse(cls, text: str, worker: str, claims_dir: Path | None = None) -> InjectedFaults:
        entries = tuple(e.strip() for e in text.split(",") if e.strip())
        delays = [float(e.split(":", 1)[1]) for e in entries if e.startswith("exchange-delay:")]
        return cls(worker=worker,
                   die_sending_state=f"die-sending-state@{worker}" in entries,
                   die_sending_state_once="die-sending-state@once" in entries,
                   nan_loss=_step_faults(entries, "nan-loss", worker),
                   hang=_step_faults(entries, "hang", worker),
                   diverge=_step_faults(entries, "diverge", worker),
                   withhold=_step_faults(entries, "withhold", worker),
                   exchange_delay_s=delays[0] if delays else 0.0, claims_dir=claims_dir)

    def dies_sending_state(self, step: int) -> bool:
        # Only live state (step > 0): the first broadcast of a fresh start is not a hand-over.
        if step == 0:
            return False
        if self.die_sending_state:
            return True
        return self.die_sending_state_once and self._first_to_claim("die-sending-state")

    def loss_is_nan(self, step: int) -> bool:
        return any(f.first <= step <= f.last for f in self.nan_loss)

    def withholds(self, step: int) -> bool:
        return any(f.first <= step <= f.last for f in self.withhold)

    def before_step(self, step: int, params: list[torch.Tensor]) -> None:
        """Before computing `step`: the faults only the worker itself can cause."""
        seconds = self._hang_s(step)
        if seconds:
            log.warning("injected fault: hanging %.1f s before step %d", seconds, step)
            time.sleep(seconds)
        if self._diverges(step):
            log.warning("injected fault: perturbing parameters before step %d", step)
            with torch.no_grad():
                for p in params:
                    p.add_(1e-3)

    def _hang_s(self, step: int) -> float:
        """Seconds to hang before computing `step` (once per run)."""
        for fault in self.hang:
            if step == fault.first and self._first_to_claim(f"hang-{self.worker}-{step}"):
                return float(fault.rest or 10)
        return 0.0

    def _diverges(self, step: int) -> bool:
        return any(f.first == step for f in self.diverge) and \
            self._first_to_claim(f"diverge-{self.worker}-{step}")

    def _first_to_claim(self, name: str) -> bool:
        """True for the first process of the run to claim `name` (a marker in the run directory)."""
        if self.claims_dir is None:
            return True
        try:
            os.close(os.open(self.claims_dir / f"injected-{name}", os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


def _step_faults(entries: tuple[str, ...], name: str, worker: str) -> tuple[StepFault, ...]:
    """(first step, last step, rest) of each `name@worker:stepN[-M][:rest]` entry."""
    pattern = re.compile(rf"^{name}@{re.escape(worker)}:step(\d+)(?:-(\d+))?(?::(.*))?$")
    found = []
    for entry in entries:
        match = pattern.match(entry)
        if match:
            first = int(match[1])
            found.append(StepFault(first, int(match[2] or first), match[3] or ""))
    return tuple(found)
