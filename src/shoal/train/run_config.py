"""How a worker finds its job and how its runtime behaves.

The launcher (or coordinator) passes these to worker processes as
SHOAL_* environment variables; `from_env` reads and checks them.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shoal.train.errors import TrainError
from shoal.train.guard import GuardConfig


@dataclass(frozen=True)
class RunConfig:
    worker: str  # unique id of this worker process
    host: str  # rendezvous store (hosted by the launcher or coordinator)
    port: int
    run_dir: Path | None = None  # step logs for the launcher's report
    backend: str = "gloo"
    collective_timeout_s: float = 30.0  # how long an abandoned collective may linger
    poll_s: float = 0.005  # how often waits check for a newer membership epoch
    checkpoint_dir: str | None = None
    checkpoint_interval: int = 100
    checkpoint_keep: int = 3
    identity: dict[str, Any] = field(default_factory=dict)  # what a checkpoint must match
    replica_check_interval: int = 0  # steps between parameter-hash checks (0: after re-forms only)
    rebalance_interval: int = 20  # steps between share re-weighting by measured speed (0: off)
    speed_report_interval: int = 5
    slowdown: float = 1.0  # simulate a device this many times slower (tests, benchmarks)
    spare: bool = False  # a warm spare: joins only when the launcher activates it
    # A warm spare runs one throwaway micro-batch through the loop before it waits, so
    # that its first real step does not pay a fresh process's first-touch costs.
    spare_warmup: bool = True
    adversary: str | None = None  # cheat as this built-in or module:callable (tests, rehearsals)
    inject: str = ""  # faults this worker injects itself (`shoal.train.inject`; tests, rehearsals)
    guard: GuardConfig = GuardConfig()

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise TrainError(f"rendezvous port {self.port} is not a valid TCP port")
        if self.poll_s <= 0 or self.collective_timeout_s <= 0:
            raise TrainError("poll_s and collective_timeout_s must be positive")
        if self.slowdown < 1.0:
            raise TrainError("slowdown must be at least 1.0")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RunConfig:
        env = dict(os.environ if env is None else env)
        address = env.get("SHOAL_RENDEZVOUS")
        if not address:
            raise TrainError("SHOAL_RENDEZVOUS is not set: start workers with "
                             "`shoal run SCRIPT.py --workers N`, or pass shoal.join() a RunConfig")
        host, _, port = address.rpartition(":")
        try:
            config = cls(worker=env.get("SHOAL_WORKER") or f"w-{uuid.uuid4().hex[:8]}",
                         host=host, port=int(port))
        except ValueError:
            raise TrainError(f"SHOAL_RENDEZVOUS={address!r} is not HOST:PORT") from None
        return config.with_overrides(env)

    def with_overrides(self, env: dict[str, str]) -> RunConfig:
        changes: dict[str, Any] = {}
        if env.get("SHOAL_RUN_DIR"):
            changes["run_dir"] = Path(env["SHOAL_RUN_DIR"])
        if env.get("SHOAL_CHECKPOINT_DIR"):
            changes["checkpoint_dir"] = env["SHOAL_CHECKPOINT_DIR"]
        if env.get("SHOAL_SPARE") == "1":
            changes["spare"] = True
        if env.get("SHOAL_SPARE_WARMUP") == "0":
            changes["spare_warmup"] = False
        if env.get("SHOAL_ADVERSARY"):
            changes["adversary"] = env["SHOAL_ADVERSARY"]
        if env.get("SHOAL_INJECT"):
            changes["inject"] = env["SHOAL_INJECT"]
        if env.get("SHOAL_IDENTITY"):
            changes["identity"] = json.loads(env["SHOAL_IDENTITY"])
        numbers = {"SHOAL_BACKEND": ("backend", str), "SHOAL_SLOWDOWN": ("slowdown", float),
                   "SHOAL_POLL_S": ("poll_s", float),
                   "SHOAL_CHECKPOINT_INTERVAL": ("checkpoint_interval", int),
                   "SHOAL_REPLICA_CHECK": ("replica_check_interval", int),
                   "SHOAL_REBALANCE": ("rebalance_interval", int),
                   "SHOAL_COLLECTIVE_TIMEOUT_S": ("collective_timeout_s", float)}
        for key, (name, kind) in numbers.items():
            if env.get(key):
                try:
                    changes[name] = kind(env[key])
                except ValueError:
                    raise TrainError(f"{key}={env[key]!r} is not a valid {kind.__name__}") from None
        return replace(self, **changes)
