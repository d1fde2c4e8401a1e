"""`shoal run SCRIPT.py --workers N`: launch any script that uses shoal.train.join()."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from shoal import ShoalError
from shoal.cli.launch_options import (
    CHAOS, REPLICA_CHECK, REPORT, RUN_DIR, SLOW, SPARES, STALL_DEADLINE_S, STALL_S, WORKERS,
    LaunchOptions, launch_and_report,
)


def run_command(
    script: Path = typer.Argument(..., help="Python training script using shoal.join()."),
    args: Optional[list[str]] = typer.Argument(None, help="Arguments for the script (after --)."),
    workers: int = WORKERS,
    chaos: str = CHAOS,
    stall_s: float = STALL_S,
    stall_deadline_s: float = STALL_DEADLINE_S,
    slow: list[str] = SLOW,
    run_dir: Optional[Path] = RUN_DIR,
    report: Optional[Path] = REPORT,
    replica_check_every: int = REPLICA_CHECK,
    spares: int = SPARES,
) -> None:
    """Run SCRIPT on N workers like torchrun, but faults cost no restart."""
    if not script.is_file():
        raise ShoalError(f"script '{script}' not found")
    from shoal.control.launcher import worker_command

    options = LaunchOptions(workers, chaos, stall_s, stall_deadline_s, tuple(slow), run_dir,
                            replica_check_every, spares)
    launch_and_report(options.config(worker_command(str(script), list(args or [])), script.stem), report)
