"""How a worker finds its job and how its runtime behaves.

A launcher (or coordinator) hands each worker process a `RunConfig`: its place in
the job and the run's `RunSettings`, with `WorkerOverrides` where one worker differs.
They cross the process boundary as SHOAL_* environment variables: `to_env` writes
them, `from_env` reads and checks them, and this module is the one place their
names are spelled.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from shoal.train.errors import TrainError
from shoal.train.guard import GuardConfig


@dataclass(frozen=True)
class RunSettings:
    """How every worker of a run behaves: chosen by whoever launches the run."""

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
    # A warm spare runs one throwaway micro-batch through the loop before it waits, so
    # that its first real step does not pay a fresh process's first-touch costs.
    spare_warmup: bool = True
    adversary: str | None = None  # cheat as this built-in or module:callable (tests, rehearsals)
    inject: str = ""  # faults this worker injects itself (`shoal.train.inject`; tests, rehearsals)
    guard: GuardConfig = GuardConfig()

    def __post_init__(self) -> None:
        if self.poll_s <= 0 or self.collective_timeout_s <= 0:
            raise TrainError("poll_s and collective_timeout_s must be positive")
        if self.slowdown < 1.0:
            raise TrainError("slowdown must be at least 1.0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RunSettings:
        """The settings `env` (default: this process's environment) names, the defaults
        for the rest; a value that does not parse is named in the error."""
        env = os.environ if env is None else env
        changes: dict[str, Any] = {}
        for name, (key, parse, _) in SETTINGS.items():
            if env.get(key):
                try:
                    changes[name] = parse(env[key])
                except ValueError:
                    raise TrainError(f"{key}={env[key]!r} is not a valid {name}") from None
        return cls(**changes)

    def to_env(self) -> dict[str, str]:
        """The environment `from_env` reads these settings back from."""
        env = {}
        for name, (key, _, write) in SETTINGS.items():
            value = getattr(self, name)
            if value is not None and value != "":
                env[key] = write(value)
        return env


@dataclass(frozen=True)
class WorkerOverrides:
    """Where one worker of a run differs from the run's settings (tests, rehearsals,
    benchmarks). None keeps the run's value."""

    slowdown: float | None = None  # behave like a device this many times slower
    adversary: str | None = None  # cheat as this built-in or module:callable
    inject: str | None = None  # faults this worker injects itself

    def __post_init__(self) -> None:
        if self.slowdown is not None and self.slowdown < 1.0:
            raise TrainError(f"a worker's slowdown must be at least 1.0, not {self.slowdown}")

    def over(self, settings: RunSettings) -> RunSettings:
        """`settings` with this worker's differences in place."""
        changes = {f.name: getattr(self, f.name) for f in fields(self)
                   if getattr(self, f.name) is not None}
        return replace(settings, **changes)


@dataclass(frozen=True)
class RunConfig:
    """One worker's place in its job, and the settings it runs with."""

    worker: str  # unique id of this worker process
    host: str  # rendezvous store (hosted by the launcher or coordinator)
    port: int
    run_dir: Path | None = None  # step logs for the launcher's report
    spare: bool = False  # a warm spare: joins only when the launcher activates it
    settings: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise TrainError(f"rendezvous port {self.port} is not a valid TCP port")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RunConfig:
        """A worker's config, as its launcher wrote it (`to_env`)."""
        env = dict(os.environ if env is None else env)
        address = env.get(RENDEZVOUS)
        if not address:
            raise TrainError(f"{RENDEZVOUS} is not set: start workers with "
                             "`shoal run SCRIPT.py --workers N`, or pass shoal.join() a RunConfig")
        host, port = _endpoint(address)
        run_dir = env.get(RUN_DIR)
        return cls(worker=env.get(WORKER) or f"w-{uuid.uuid4().hex[:8]}", host=host, port=port,
                   run_dir=Path(run_dir) if run_dir else None, spare=env.get(SPARE) == "1",
                   settings=RunSettings.from_env(env))

    @classmethod
    def launched(cls, rendezvous: str, worker: str, run_dir: Path, spare: bool,
                 settings: RunSettings) -> RunConfig:
        """What a launcher hands a worker it starts: its place in the job (`rendezvous`
        is HOST:PORT), and the settings it runs with."""
        host, port = _endpoint(rendezvous)
        return cls(worker=worker, host=host, port=port, run_dir=run_dir, spare=spare,
                   settings=settings)

    def to_env(self) -> dict[str, str]:
        """The environment a worker reads this config back from (`from_env`)."""
        env = {RENDEZVOUS: f"{self.host}:{self.port}", WORKER: self.worker,
               SPARE: "1" if self.spare else "0"}
        if self.run_dir is not None:
            env[RUN_DIR] = str(self.run_dir)
        return {**env, **self.settings.to_env()}


RENDEZVOUS, WORKER, RUN_DIR, SPARE = "SHOAL_RENDEZVOUS", "SHOAL_WORKER", "SHOAL_RUN_DIR", "SHOAL_SPARE"


def without_run_config(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less every variable a `RunConfig` writes: what a launcher's workers inherit,
    so that their settings come from the config they are given and nothing else."""
    return {key: value for key, value in env.items() if key not in VARIABLES}


def _endpoint(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        raise TrainError(f"{RENDEZVOUS}={address!r} is not HOST:PORT") from None


def _unless_zero(text: str) -> bool:
    return text != "0"


# Each setting a worker reads from its environment: field -> (variable, read, write).
SETTINGS: dict[str, tuple[str, Callable[[str], Any], Callable[[Any], str]]] = {
    "backend": ("SHOAL_BACKEND", str, str),
    "collective_timeout_s": ("SHOAL_COLLECTIVE_TIMEOUT_S", float, repr),
    "poll_s": ("SHOAL_POLL_S", float, repr),
    "checkpoint_dir": ("SHOAL_CHECKPOINT_DIR", str, str),
    "checkpoint_interval": ("SHOAL_CHECKPOINT_INTERVAL", int, str),
    "identity": ("SHOAL_IDENTITY", json.loads, json.dumps),
    "replica_check_interval": ("SHOAL_REPLICA_CHECK", int, str),
    "rebalance_interval": ("SHOAL_REBALANCE", int, str),
    "slowdown": ("SHOAL_SLOWDOWN", float, repr),
    "spare_warmup": ("SHOAL_SPARE_WARMUP", _unless_zero, lambda on: "1" if on else "0"),
    "adversary": ("SHOAL_ADVERSARY", str, str),
    "inject": ("SHOAL_INJECT", str, str),
}

# Every variable a RunConfig writes.
VARIABLES = frozenset({RENDEZVOUS, WORKER, RUN_DIR, SPARE, *(key for key, _, _ in SETTINGS.values())})
