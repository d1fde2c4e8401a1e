"""What a launcher starts and how: the worker command and count on this
host, the chaos schedule, and, across hosts, the rendezvous it names and
whether it serves it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shoal.elastic.chaos import ChaosEvent
from shoal.errors import ControlError
from shoal.elastic.netaddr import parse_endpoint
from shoal.spec.coordinator import RendezvousPass
from shoal.train.run_config import VARIABLES, RunSettings, WorkerOverrides


@dataclass(frozen=True)
class LaunchConfig:
    command: list[str]  # the worker program, e.g. [python, script.py, args...]
    workers: int  # on this host
    run_dir: Path
    chaos: list[ChaosEvent] = field(default_factory=list)  # on this host's workers
    stall_s: float = 5.0  # how long a `stall` keeps the worker stopped
    stall_deadline_s: float = 1.0  # least time a member may fall behind its peers before it is fenced
    # How the workers run, and where one of them differs (per launch index): each worker
    # process is handed them, in its `shoal.train.run_config.RunConfig`, when it starts.
    settings: RunSettings = field(default_factory=RunSettings)
    overrides: dict[int, WorkerOverrides] = field(default_factory=dict)
    # The workers' process environment beyond the launcher's own (threads, logging; per
    # launch index, e.g. the cgroup a benchmark starts one in); never a run setting.
    env: dict[str, str] = field(default_factory=dict)
    worker_env: dict[int, dict[str, str]] = field(default_factory=dict)
    timeout_s: float = 3600.0
    # Warm spares: started and ready (torch imported, model built) but idle until a
    # `join` calls one in, so a join costs a state transfer, not a process start.
    spares: int = 0
    # On one host, a worker that exits unasked (not by --chaos, not done) is replaced by a
    # new one that joins the running job, at most this many times in the run (torchrun's
    # --max-restarts, but nobody else restarts). Where every worker is gone there is no one
    # to join: the run stops with the first worker's error instead.
    max_restarts: int = 3
    # Across hosts, every launcher names the same rendezvous and one of them serves it.
    rendezvous: str | None = None  # HOST:PORT; None: one host, served here on a free port
    serve: bool = False  # host the store and the authority (implied on one host)
    # A market job's host serves behind a gate: what this host's launcher shows it (its
    # workers reach the store through the launcher's tunnel).
    rendezvous_pass: RendezvousPass | None = None
    # Where the store listens (serving) and the address this host's workers give their
    # peers. Default: 127.0.0.1 on one host; across hosts the rendezvous host when
    # serving, else the local address that reaches it.
    bind: str | None = None
    node: str = ""  # across hosts, worker ids are NODE-w<i> (default: the hostname)
    min_workers: int | None = None  # first epoch, all hosts together (serving; default: workers)
    grace_s: float = 30.0  # on SIGTERM, how long workers get to hand over before they are killed

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ControlError("--workers must be at least 1")
        if self.spares < 0:
            raise ControlError("--spares cannot be negative")
        if self.max_restarts < 0:
            raise ControlError("--max-restarts cannot be negative")
        if self.rendezvous is not None:
            parse_endpoint(self.rendezvous)
        elif self.serve or self.node:
            raise ControlError("--serve and --node need --rendezvous HOST:PORT")
        if self.rendezvous_pass is not None and (self.rendezvous is None or self.serve):
            raise ControlError("a rendezvous pass is for reaching a gated host named by "
                               "--rendezvous, not for serving one")
        if self.min_workers is not None and (self.min_workers < 1 or not self.serves):
            raise ControlError("--min-workers is for the serving host and must be at least 1")
        if self.grace_s < 0:
            raise ControlError("--grace-s cannot be negative")
        for env in (self.env, *self.worker_env.values()):
            if named := sorted(VARIABLES & set(env)):
                raise ControlError(f"{', '.join(named)}: a run's settings go in LaunchConfig's "
                                   "settings and overrides, not in its workers' environment")

    def settings_of(self, index: int) -> RunSettings:
        """The settings of the worker started at launch index `index`."""
        overrides = self.overrides.get(index)
        return self.settings if overrides is None else overrides.over(self.settings)

    @property
    def serves(self) -> bool:
        return self.rendezvous is None or self.serve
