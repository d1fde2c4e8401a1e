"""Entry point of the `shoal` command.

Subcommands live in their own modules and register here. A `ShoalError`
(a user mistake or an environment problem) becomes one line on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import os
import sys

# Before torch loads: c10d logs every store wait that times out, and shoal's
# cancellable waits time out on purpose.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import typer

from shoal import ShoalError, __version__
from shoal.cli.agent_cmd import agent_command
from shoal.cli.bundle_cmd import bundle_command
from shoal.cli.chain_cmd import chain_app
from shoal.cli import chain_tx_cmd  # noqa: F401  (adds create-job, fund, stake, withdraw)
from shoal.cli.coordinator_cmd import coordinator_command
from shoal.cli.log_format import configure as configure_logging
from shoal.cli.plan_cmd import plan_command
from shoal.cli.demo_cmd import demo_command
from shoal.cli.dispute_cmd import dispute_command
from shoal.cli.market_cmd import (
    cancel_command, events_command, grant_command, jobs_command, key_app, providers_command,
    model_command, submit_command, top_up_command,
)
from shoal.cli.rendezvous_cmd import rendezvous_command, rendezvous_pass_command
from shoal.cli.report_cmd import report_command
from shoal.cli.run_cmd import run_command
from shoal.cli.train_cmd import train_command
from shoal.cli.verify_cmd import verify_command

app = typer.Typer(
    name="shoal",
    help="Train neural networks on compute that comes and goes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("train")(train_command)
app.command("run")(run_command)
app.add_typer(chain_app, name="chain")
app.command("rendezvous")(rendezvous_command)
app.command("rendezvous-pass")(rendezvous_pass_command)
app.command("coordinator")(coordinator_command)
app.command("agent")(agent_command)
app.command("submit")(submit_command)
app.command("bundle")(bundle_command)
app.command("jobs")(jobs_command)
app.command("model")(model_command)
app.command("providers")(providers_command)
app.command("events")(events_command)
app.command("top-up")(top_up_command)
app.command("cancel")(cancel_command)
app.command("grant")(grant_command)
app.add_typer(key_app, name="key")
app.command("plan")(plan_command)
app.command("verify")(verify_command)
app.command("dispute")(dispute_command)
app.command("demo")(demo_command)
app.command("report")(report_command)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug detail."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    log_json: bool = typer.Option(False, "--log-json", envvar="SHOAL_LOG_JSON",
                                  help="Log one JSON object per line (for log collectors)."),
) -> None:
    if version:
        typer.echo(f"shoal {__version__}")
        raise typer.Exit()
    configure_logging(verbose, log_json)


def main() -> None:
    try:
        app()
    except ShoalError as error:
        print(f"shoal: error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("shoal: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
