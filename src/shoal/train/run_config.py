"""How a worker finds its job and how its runtime behaves.

The launcher (or coordinator) passes these to worker processes as
SHOAL_* environment variables: `to_env` writes them, `from_env` reads and
checks them, and `SETTINGS` is the one place their names are spelled.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping
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
    def from_env(cls, env: Mapping[str, str] | None = None) -> RunConfig:
        """A worker's config, as its launcher wrote it (`to_env`)."""
        env = dict(os.environ if env is None else env)
        address = env.get(RENDEZVOUS)
        if not address:
            raise TrainError(f"{RENDEZVOUS} is not set: start workers with "
                             "`shoal run SCRIPT.py --workers N`, or pass shoal.join() a RunConfig")
        host, port = _endpoint(address)
        return cls(worker=env.get(WORKER) or f"w-{uuid.uuid4().hex[:8]}", host=host,
                   port=port).with_overrides(env)

    @classmethod
    def launched(cls, rendezvous: str, worker: str, run_dir: Path, spare: bool,
                 settings: Mapping[str, str]) -> RunConfig:
        """What a launcher hands a worker it starts: its place in the job, and the job's
        settings (SHOAL_* strings of the launcher's environment and its caller's),
        checked here before any worker starts."""
        host, port = _endpoint(rendezvous)
        config = cls(worker=worker, host=host, port=port).with_overrides(settings)
        return replace(config, run_dir=run_dir, spare=spare)

    def with_overrides(self, env: Mapping[str, str]) -> RunConfig:
        """This config with the settings `env` names (SHOAL_* strings) in place."""
        changes: dict[str, Any] = {}
        for name, (key, parse, _) in SETTINGS.items():
            if env.get(key):
                try:
                    changes[name] = parse(env[key])
                except ValueError:
                    raise TrainError(f"{key}={env[key]!r} is not a valid {name}") from None
        return replace(self, **changes)

    def to_env(self) -> dict[str, str]:
        """The environment a worker reads this config back from (`from_env`)."""
        env = {RENDEZVOUS: f"{self.host}:{self.port}", WORKER: self.worker}
        for name, (key, _, write) in SETTINGS.items():
            value = getattr(self, name)
            if value is not None and value != "":
                env[key] = write(value)
        return env


RENDEZVOUS, WORKER = "SHOAL_RENDEZVOUS", "SHOAL_WORKER"


def _endpoint(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        raise TrainError(f"{RENDEZVOUS}={address!r} is not HOST:PORT") from None


def _flag(text: str) -> bool:
    return text == "1"


def _unless_zero(text: str) -> bool:
    return text != "0"


# Each setting a worker reads from its environment: field -> (variable, read, write).
# The one place these names are spelled; launchers write them with `to_env`.
SETTINGS: dict[str, tuple[str, Callable[[str], Any], Callable[[Any], str]]] = {
    "run_dir": ("SHOAL_RUN_DIR", Path, str),
    "backend": ("SHOAL_BACKEND", str, str),
    "collective_timeout_s": ("SHOAL_COLLECTIVE_TIMEOUT_S", float, repr),
    "poll_s": ("SHOAL_POLL_S", float, repr),
    "checkpoint_dir": ("SHOAL_CHECKPOINT_DIR", str, str),
    "checkpoint_interval": ("SHOAL_CHECKPOINT_INTERVAL", int, str),
    "identity": ("SHOAL_IDENTITY", json.loads, json.dumps),
    "replica_check_interval": ("SHOAL_REPLICA_CHECK", int, str),
    "rebalance_interval": ("SHOAL_REBALANCE", int, str),
    "slowdown": ("SHOAL_SLOWDOWN", float, repr),
    "spare": ("SHOAL_SPARE", _flag, lambda on: "1" if on else "0"),
    "spare_warmup": ("SHOAL_SPARE_WARMUP", _unless_zero, lambda on: "1" if on else "0"),
    "adversary": ("SHOAL_ADVERSARY", str, str),
    "inject": ("SHOAL_INJECT", str, str),
}
