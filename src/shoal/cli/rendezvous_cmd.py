"""`shoal rendezvous`: host one job's store and membership authority, no workers
(like torchrun's standalone rendezvous endpoint, or torchft's lighthouse)."""

from __future__ import annotations

from pathlib import Path

import typer


def rendezvous_command(
    bind: str = typer.Option("127.0.0.1", "--bind", help="Address the store listens on."),
    port: int = typer.Option(0, "--port", help="TCP port (0: a free one, written to host.json)."),
    run_dir: Path = typer.Option(..., "--run-dir", help="Where host.json, epochs and final.json go."),
    min_workers: int = typer.Option(1, "--min-workers", min=1, help="Workers the first epoch waits for."),
    stall_deadline_s: float = typer.Option(1.0, "--stall-deadline-s", min=0.1,
                                           help="Least time a worker may fall behind before it is fenced."),
    linger_s: float = typer.Option(10.0, "--linger-s", min=0.0,
                                   help="Seconds to keep the store up after the job ends."),
    gate_dir: Path | None = typer.Option(
        None, "--gate-dir", help="Serve the store on loopback behind a TLS gate on --bind that "
        "admits only holders of a token made from the keys in this folder (made there if "
        "missing; what the coordinator does for market jobs)."),
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="The job's steps: it ends only once every member has "
        "finished them (without: when every member says it finished)."),
) -> None:
    """Serve one job's rendezvous until it is done; workers join with --rendezvous HOST:PORT."""
    from shoal.elastic.job_host import JobHostConfig, serve_job

    final = serve_job(JobHostConfig(bind, port, run_dir, min_workers, stall_deadline_s, linger_s,
                                    gate_dir, steps))
    if "failed" in final:
        raise typer.Exit(code=1)


def rendezvous_pass_command(
    gate_dir: Path = typer.Argument(..., help="The gate's keys, as given to `shoal rendezvous "
                                    "--gate-dir` (made there if missing)."),
    identity: str = typer.Argument(..., help="Who the pass is for (a host's name; the "
                                   "coordinator uses lease:N)."),
) -> None:
    """Print a pass to a gated rendezvous (JSON): export it as SHOAL_RENDEZVOUS_PASS on a
    host before `shoal run --rendezvous HOST:PORT` there."""
    from shoal.elastic.gate_keys import GateKeys

    typer.echo(GateKeys.create_or_load(gate_dir).gate_pass(identity).model_dump_json())
