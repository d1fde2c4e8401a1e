"""`shoal run SCRIPT.py --workers N`: launch any script that uses shoal.train.join()."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from shoal import ShoalError
from shoal.cli.launch_options import (
    CHAOS, REPLICA_CHECK, REPORT, RUN_DIR, SLOW, STALL_DEADLINE_S, STALL_S, WORKERS,
    default_run_dir, launch_and_report, parse_slow, runtime_env,
)


def run_command(
    script: Path = typer.Argument(..., help="Python training script using shoal.train.join()."),
    args: Optional[list[str]] = typer.Argument(None, help="Arguments for the script (after --)."),
    workers: int = WORKERS,
    chaos: str = CHAOS,
    stall_s: float = STALL_S,
    stall_deadline_s: float = STALL_DEADLINE_S,
    slow: list[str] = SLOW,
    run_dir: Optional[Path] = RUN_DIR,
    report: Optional[Path] = REPORT,
    replica_check_every: int = REPLICA_CHECK,
) -> None:
    """Run SCRIPT on N workers like torchrun, but faults cost no restart."""
    if not script.is_file():
        raise ShoalError(f"script '{script}' not found")
    from shoal.train.chaos import parse_chaos
    from shoal.train.launcher import LaunchConfig, worker_command

    config = LaunchConfig(
        command=worker_command(str(script), list(args or [])), workers=workers,
        run_dir=run_dir or default_run_dir(script.stem), chaos=parse_chaos(chaos),
        stall_s=stall_s, stall_deadline_s=stall_deadline_s, worker_env=parse_slow(slow),
        env=runtime_env(replica_check_every),
    )
    launch_and_report(config, report)
