"""Fault schedules for rehearsal: `kill:1@30s,join@45s,stall:0@step200,leave:2@90s`.

ACTION is kill (SIGKILL), stall (SIGSTOP, SIGCONT after --stall-s), leave
(SIGTERM, a spot notice) or join (start a new worker); WORKER is a launch
index (omitted: the newest live worker; never for join); WHEN is seconds
since start (`30s`, `2.5s`) or a step (`step120`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shoal.spec.elastic import FaultKind
from shoal.errors import ControlError

_EVENT = re.compile(r"^(?P<action>[a-z]+)(?::(?P<worker>\d+))?@(?:(?P<secs>\d+(?:\.\d+)?)s|step(?P<step>\d+))$")


class ChaosError(ControlError):
    """A --chaos schedule that does not parse."""


@dataclass(frozen=True)
class ChaosEvent:
    kind: FaultKind
    worker: int | None  # launch index; None: the newest live worker (or a new one for join)
    at_s: float | None = None
    at_step: int | None = None

    def due(self, elapsed_s: float, step: int) -> bool:
        if self.at_s is not None:
            return elapsed_s >= self.at_s
        return step >= (self.at_step or 0)

    def __str__(self) -> str:
        who = f":{self.worker}" if self.worker is not None else ""
        when = f"{self.at_s:g}s" if self.at_s is not None else f"step{self.at_step}"
        return f"{self.kind.value}{who}@{when}"


def parse_chaos(text: str) -> list[ChaosEvent]:
    events = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _EVENT.match(part)
        if not match:
            raise ChaosError(f"chaos event '{part}' is not ACTION[:WORKER]@WHEN "
                             "(e.g. kill:1@30s, join@45s, stall:0@step200)")
        try:
            kind = FaultKind(match["action"])
        except ValueError:
            raise ChaosError(f"chaos action '{match['action']}' is unknown; use kill, stall, "
                             "leave or join") from None
        worker = int(match["worker"]) if match["worker"] is not None else None
        if kind is FaultKind.join and worker is not None:
            raise ChaosError(f"'{part}': join starts a new worker and takes no worker index")
        at_s = float(match["secs"]) if match["secs"] is not None else None
        at_step = int(match["step"]) if match["step"] is not None else None
        events.append(ChaosEvent(kind, worker, at_s, at_step))
    return events
