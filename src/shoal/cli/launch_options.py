"""Options shared by `shoal run` and `shoal train --workers`: how many
workers, which faults to rehearse, and where the run's files go."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from shoal import ShoalError

if TYPE_CHECKING:
    from shoal.elastic.launcher import LaunchConfig
    from shoal.spec.coordinator import RendezvousPass
    from shoal.train.run_config import RunSettings, WorkerOverrides


def parse_slow(values: list[str]) -> dict[int, float]:
    """`--slow 1:3` makes worker 1 behave like a device 3x slower."""
    factors: dict[int, float] = {}
    for value in values:
        index, _, factor = value.partition(":")
        try:
            if float(factor) < 1.0:
                raise ValueError
            factors[int(index)] = float(factor)
        except ValueError:
            raise ShoalError(f"--slow {value!r}: expected WORKER:FACTOR with FACTOR >= 1, e.g. 1:3") from None
    return factors


def parse_adversaries(values: list[str]) -> dict[int, str]:
    """`--adversary 1=sign_flip` makes worker 1 cheat (a built-in NAME or module:callable)."""
    names: dict[int, str] = {}
    for value in values:
        index, _, name = value.partition("=")
        if not index.strip().isdigit() or not name.strip():
            raise ShoalError(f"--adversary {value!r}: expected WORKER=NAME, e.g. 1=sign_flip "
                             "(NAME: a built-in or module:callable)")
        names[int(index)] = name.strip()
    return names


def worker_overrides(slow: dict[int, float], adversaries: dict[int, str]) -> dict[int, WorkerOverrides]:
    """What each worker named by --slow or --adversary does differently."""
    from shoal.train.run_config import WorkerOverrides

    return {index: WorkerOverrides(slowdown=slow.get(index), adversary=adversaries.get(index))
            for index in sorted({*slow, *adversaries})}


def default_run_dir(name: str) -> Path:
    return Path("runs") / name / time.strftime("elastic-%Y%m%d-%H%M%S")


@dataclass(frozen=True)
class HostOptions:
    """Across hosts: every host names the same rendezvous; one of them serves it."""

    rendezvous: str | None = None
    serve: bool = False
    bind: str | None = None
    node: str | None = None
    min_workers: int | None = None
    grace_s: float = 30.0

    def config_fields(self) -> dict[str, object]:
        return {"rendezvous": self.rendezvous, "serve": self.serve, "bind": self.bind,
                "node": self.node or "", "min_workers": self.min_workers, "grace_s": self.grace_s,
                "rendezvous_pass": rendezvous_pass_from_env() if self.rendezvous else None}


def rendezvous_pass_from_env() -> RendezvousPass | None:
    """The pass to a gated job host, from SHOAL_RENDEZVOUS_PASS (JSON; an agent sets it
    for the launcher of each lease): in the environment, not on a command line that every
    user of the machine can read, and taken out of it, so the workers do not inherit it."""
    from pydantic import ValidationError

    from shoal.elastic.gate_keys import PASS_ENV
    from shoal.spec.coordinator import RendezvousPass

    text = os.environ.pop(PASS_ENV, None)
    if not text:
        return None
    try:
        return RendezvousPass.model_validate_json(text)
    except ValidationError as error:
        raise ShoalError(f"{PASS_ENV} is not a rendezvous pass ({error.error_count()} problems: "
                         f"{error.errors()[0]['msg']}); it is set by the agent from the "
                         "coordinator's assignment") from None


@dataclass(frozen=True)
class LaunchOptions:
    """The launch flags `shoal run` and `shoal train --workers` share."""

    workers: int
    chaos: str = ""
    stall_s: float = 5.0
    stall_deadline_s: float = 1.0
    slow: tuple[str, ...] = ()
    adversaries: tuple[str, ...] = ()
    run_dir: Path | None = None
    replica_check_every: int = 0
    spares: int = 0
    max_restarts: int = 3
    hosts: HostOptions = HostOptions()

    def config(self, command: list[str], name: str, settings: RunSettings) -> LaunchConfig:
        """`settings`: the run's (`run_settings`), before these flags."""
        from shoal.elastic.chaos import parse_chaos
        from shoal.elastic.launcher import LaunchConfig

        if self.replica_check_every:
            settings = replace(settings, replica_check_interval=self.replica_check_every)
        return LaunchConfig(
            command=command, workers=self.workers, run_dir=self.run_dir or default_run_dir(name),
            chaos=parse_chaos(self.chaos), stall_s=self.stall_s,
            stall_deadline_s=self.stall_deadline_s, settings=settings,
            overrides=worker_overrides(parse_slow(list(self.slow)),
                                       parse_adversaries(list(self.adversaries))),
            spares=self.spares, max_restarts=self.max_restarts, **self.hosts.config_fields(),
        )


def run_settings(**changes: Any) -> RunSettings:
    """The run's settings: those the launcher's environment names (SHOAL_* variables, the
    user's own), with what the command sets (`changes`, RunSettings fields) over them."""
    from shoal.train.run_config import RunSettings

    return replace(RunSettings.from_env(), **changes)


def launch_and_report(config: LaunchConfig, report: Path | None) -> None:
    from shoal.elastic.launcher import Launcher

    if report is not None and not config.serves:
        raise ShoalError("--report is written by the serving host; pass it with --serve")
    result = Launcher(config).run()
    if result is None:
        typer.echo(f"the job is done; this host ran {config.workers} worker(s). The serving host "
                   "wrote the report.")
        return
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.model_dump_json(indent=2) + "\n")
    faults = ", ".join(
        f"{f.kind.value}:{f.worker} rto={f.recovery_s if f.recovery_s is not None else '-'}s"
        for f in result.faults) or "none"
    typer.echo(f"{result.steps} steps, {result.throughput_samples_per_s:.1f} samples/s, "
               f"faults: {faults}; skipped {result.samples_skipped}, duplicated "
               f"{result.samples_duplicated}, replica mismatches {result.replica_mismatches}; "
               f"params {str(result.param_sha256)[:12]}")
    if result.samples_skipped or result.samples_duplicated or result.replica_mismatches:
        raise ShoalError("the run broke an invariant (see the report): " + json.dumps(
            {"skipped": result.samples_skipped, "duplicated": result.samples_duplicated,
             "replica_mismatches": result.replica_mismatches}))


WORKERS = typer.Option(..., "--workers", "-n", min=1, help="Worker processes to start on this host.")
CHAOS = typer.Option("", "--chaos", help="Faults to inject: ACTION[:WORKER]@WHEN, comma-separated "
                     "(kill, stall, leave, join; WHEN 30s or step120).")
STALL_S = typer.Option(5.0, "--stall-s", min=0.0, help="How long a `stall` keeps a worker stopped.")
STALL_DEADLINE_S = typer.Option(1.0, "--stall-deadline-s", min=0.1,
                                help="Least time a worker may fall behind its peers before it is "
                                     "fenced (the deadline grows with measured step times).")
SLOW = typer.Option([], "--slow", help="WORKER:FACTOR, simulate a slower device (repeatable).")
ADVERSARY = typer.Option([], "--adversary", metavar="WORKER=NAME",
                         help="Make a worker cheat, to rehearse defences (repeatable): NAME is a "
                              "built-in (random, zero, scale, sign_flip, sign_flip_scaled, replay, "
                              "other_samples, half_samples, bad_commitment, copy) or module:callable.")
RUN_DIR = typer.Option(None, "--run-dir", help="Where worker logs and step logs go.")
REPORT = typer.Option(None, "--report", help="Write the run's JSON report here.")
SPARES = typer.Option(0, "--spares", min=0,
                      help="Warm spares kept ready; a `join` calls one in (no process start).")
MAX_RESTARTS = typer.Option(3, "--max-restarts", min=0,
                            help="On one host: replace a worker that exits unasked (a crash, "
                                 "an OOM kill) by a new one joining the job, at most N times.")
REPLICA_CHECK = typer.Option(0, "--replica-check-every", min=0,
                             help="Hash every replica's parameters every N steps (0: after re-forms only).")

CHECKPOINT_DIR = typer.Option(None, "--checkpoint-dir",
                              help="Where workers write checkpoints (SHOAL_CHECKPOINT_DIR).")

# Across hosts.
RENDEZVOUS = typer.Option(None, "--rendezvous", metavar="HOST:PORT",
                          help="Run across hosts: the same HOST:PORT on every host; one of them "
                               "passes --serve and hosts it.")
SERVE = typer.Option(False, "--serve", help="Host the rendezvous store and the membership "
                                            "authority here (one host per job).")
BIND = typer.Option(None, "--bind", metavar="ADDR",
                    help="Address to listen on (--serve) and for this host's workers to use. "
                         "Default: 127.0.0.1 on one host; with --rendezvous, its HOST when "
                         "serving, else the local address that reaches it.")
NODE = typer.Option(None, "--node", help="This host's name in worker ids (NODE-w0, ...); "
                                         "default: the hostname (a name already in the job gets a suffix).")
MIN_WORKERS = typer.Option(None, "--min-workers", min=1,
                           help="With --serve: workers on all hosts together that the first "
                                "epoch waits for (default: --workers).")
GRACE_S = typer.Option(30.0, "--grace-s", min=0.0,
                       help="On SIGTERM, how long workers get to hand over and write their last "
                            "checkpoint before they are killed.")
