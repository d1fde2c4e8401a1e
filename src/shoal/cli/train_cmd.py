"""`shoal train JOB.toml`: train the built-in GPT on a job file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from shoal.cli.launch_options import (
    ADVERSARY, BIND, MAX_RESTARTS, CHAOS, GRACE_S, MIN_WORKERS, NODE, RENDEZVOUS, REPLICA_CHECK, RUN_DIR, SERVE,
    SLOW,
    SPARES, STALL_DEADLINE_S, STALL_S, HostOptions, LaunchOptions, launch_and_report, run_settings,
)
from shoal.spec import JobSpec, load_job


def train_command(
    job_file: Path = typer.Argument(..., help="Job file (TOML), e.g. examples/tiny-gpt.toml."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest good checkpoint."),
    fresh: bool = typer.Option(False, "--fresh", help="Delete this job's checkpoints and start over."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Override the job's step count."),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="Override checkpoint.dir."),
    proof_dir: Optional[str] = typer.Option(None, "--proof-dir", help="Override proof.dir."),
    keep_proof_files: bool = typer.Option(
        False, "--keep-proof-files",
        help="Never prune the challenge files (proof.prune = false): an agent runs its "
             "workers so, and drops them when the coordinator closes each epoch's window."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write a JSON report here."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    workers: Optional[int] = typer.Option(None, "--workers", "-n", min=1,
                                          help="Train elastically on N worker processes."),
    chaos: str = CHAOS,
    stall_s: float = STALL_S,
    stall_deadline_s: float = STALL_DEADLINE_S,
    slow: list[str] = SLOW,
    adversary: list[str] = ADVERSARY,
    run_dir: Optional[Path] = RUN_DIR,
    replica_check_every: int = REPLICA_CHECK,
    spares: int = SPARES,
    max_restarts: int = MAX_RESTARTS,
    rendezvous: Optional[str] = RENDEZVOUS,
    serve: bool = SERVE,
    bind: Optional[str] = BIND,
    node: Optional[str] = NODE,
    min_workers: Optional[int] = MIN_WORKERS,
    grace_s: float = GRACE_S,
) -> None:
    """Train a job on this machine; faults cost no more than the last checkpoint."""
    if resume and fresh:
        raise typer.BadParameter("--resume and --fresh contradict each other; pick one")
    job = load_job(job_file, overrides={"steps": steps})
    if checkpoint_dir is not None:
        job = job.model_copy(update={"checkpoint": job.checkpoint.model_copy(update={"dir": checkpoint_dir})})
    if proof_dir is not None:
        job = job.model_copy(update={"proof": job.proof.model_copy(update={"dir": proof_dir})})
    if keep_proof_files:
        job = job.model_copy(update={"proof": job.proof.model_copy(update={"prune": False})})

    if workers is not None:
        options = LaunchOptions(
            workers=workers, chaos=chaos, stall_s=stall_s, stall_deadline_s=stall_deadline_s,
            slow=tuple(slow), adversaries=tuple(adversary), run_dir=run_dir,
            replica_check_every=replica_check_every,
            spares=spares, max_restarts=max_restarts, hosts=HostOptions(rendezvous, serve, bind, node, min_workers, grace_s))
        _train_elastic(job, resume, fresh, options, report)
        return
    if chaos or slow or rendezvous or adversary:
        raise typer.BadParameter("--chaos, --slow, --adversary and --rendezvous need --workers N")
    from shoal.models.single import train_job  # torch loads only when training runs

    result = train_job(job, resume=resume, fresh=fresh, show_progress=not quiet)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.model_dump_json(indent=2) + "\n")
    val = f"{result.val_loss:.4f}" if result.val_loss is not None else "n/a"
    typer.echo(f"{result.job}: {result.steps} steps, val loss {val} nats/byte, "
               f"{result.tokens_per_s:,.0f} tok/s, {result.wall_s:.1f} s, params {result.param_sha256[:12]}")


def _train_elastic(job: JobSpec, resume: bool, fresh: bool, options: LaunchOptions,
                   report: Optional[Path]) -> None:
    import sys

    from shoal.elastic import preload

    command = [sys.executable, "-m", "shoal.models.gpt_worker", "--job-json", job.model_dump_json()]
    config = options.config(command, job.name, run_settings(
        checkpoint_dir=job.checkpoint_dir, checkpoint_interval=job.checkpoint.interval_steps,
        identity=job.resume_identity()))
    preload.warm(command)  # the workers' interpreter imports torch while this one does
    from shoal.models.single import open_checkpoints, open_proof_dir

    if options.hosts.rendezvous is None or options.hosts.serve:
        # Same guard as one worker: never clobber. Only the serving host applies it, so a
        # host joining later cannot delete (--fresh) what a running job wrote to a shared disk.
        open_checkpoints(job, resume, fresh).close()
        open_proof_dir(job, resume, fresh)
    launch_and_report(config, report)
