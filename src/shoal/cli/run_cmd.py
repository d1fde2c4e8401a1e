"""`shoal run SCRIPT.py --workers N`: launch any script that uses shoal.join()."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from shoal import ShoalError
from shoal.cli.launch_options import (
    ADVERSARY, BIND, MAX_RESTARTS, CHAOS, CHECKPOINT_DIR, GRACE_S, MIN_WORKERS, NODE, RENDEZVOUS, REPLICA_CHECK,
    REPORT, RUN_DIR, SERVE, SLOW, SPARES, STALL_DEADLINE_S, STALL_S, WORKERS, HostOptions, LaunchOptions,
    launch_and_report, run_settings,
)


def run_command(
    script: Path = typer.Argument(..., help="Python training script using shoal.join()."),
    args: Optional[list[str]] = typer.Argument(None, help="Arguments for the script (after --)."),
    workers: int = WORKERS,
    chaos: str = CHAOS,
    stall_s: float = STALL_S,
    stall_deadline_s: float = STALL_DEADLINE_S,
    slow: list[str] = SLOW,
    adversary: list[str] = ADVERSARY,
    run_dir: Optional[Path] = RUN_DIR,
    report: Optional[Path] = REPORT,
    replica_check_every: int = REPLICA_CHECK,
    spares: int = SPARES,
    max_restarts: int = MAX_RESTARTS,
    checkpoint_dir: Optional[Path] = CHECKPOINT_DIR,
    rendezvous: Optional[str] = RENDEZVOUS,
    serve: bool = SERVE,
    bind: Optional[str] = BIND,
    node: Optional[str] = NODE,
    min_workers: Optional[int] = MIN_WORKERS,
    grace_s: float = GRACE_S,
) -> None:
    """Run SCRIPT on N workers like torchrun, but faults cost no restart.

    Across hosts: the same --rendezvous HOST:PORT on every host, --serve on one.
    """
    if not script.is_file():
        raise ShoalError(f"script '{script}' not found")
    from shoal.elastic import preload
    from shoal.elastic.launcher import worker_command

    options = LaunchOptions(
        workers=workers, chaos=chaos, stall_s=stall_s, stall_deadline_s=stall_deadline_s,
        slow=tuple(slow), adversaries=tuple(adversary), run_dir=run_dir,
        replica_check_every=replica_check_every, spares=spares, max_restarts=max_restarts,
        hosts=HostOptions(rendezvous, serve, bind, node, min_workers, grace_s))
    settings = (run_settings(checkpoint_dir=str(checkpoint_dir.resolve())) if checkpoint_dir
                else run_settings())
    command = worker_command(str(script), list(args or []))
    config = options.config(command, script.stem, settings)
    preload.warm(command)  # the workers' interpreter imports torch while the launcher does
    launch_and_report(config, report)
