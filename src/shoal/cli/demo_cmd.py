"""`shoal demo`: the whole network on one machine, with a live view and a report."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

DEFAULT_SCENARIO = Path(__file__).resolve().parents[3] / "examples" / "scenarios" / "default.toml"


def demo_command(
    scenario: Path = typer.Option(DEFAULT_SCENARIO, "--scenario",
                                  help="Providers, faults and their times (TOML)."),
    quick: bool = typer.Option(False, "--quick", help="A shorter job, events sooner, EF "
                                                       "estimated (for tests)."),
    report: Optional[Path] = typer.Option(None, "--report", help="Also write the JSON report here."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Where everything goes "
                                                                   "(default runs/demo-TIME)."),
    dashboard: bool = typer.Option(False, "--dashboard", help="Serve the web dashboard and "
                                                              "print its URL."),
    live: bool = typer.Option(True, "--live/--no-live", help="The live terminal view."),
) -> None:
    """Run the chain, the coordinator, providers, a verifier and a job here, with faults
    and a cheat; settle on chain; write RUN_DIR/report.json."""
    from rich.console import Console
    from rich.live import Live

    from shoal.demo.live import render
    from shoal.demo.report import build_report
    from shoal.demo.runner import Demo, DemoOptions
    from shoal.models.gpt_replay import gpt_replayer

    run_dir = run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise typer.BadParameter(f"{run_dir} is not empty (a demo's store and chain start "
                                 "fresh): give a new --run-dir or delete it")
    console = Console()
    view = Live(console=console, refresh_per_second=2, transient=False) if live else None
    last = [0.0]

    def tick(demo: Demo) -> None:
        if view is not None and time.monotonic() - last[0] > 0.5:
            last[0] = time.monotonic()
            view.update(render(demo))

    demo = Demo(DemoOptions(scenario_path=scenario, run_dir=run_dir, quick=quick,
                            dashboard=dashboard, tick=tick), replayer=gpt_replayer)
    if view is not None:
        view.start()
    try:
        demo.run()
        result = build_report(demo)
    finally:
        if view is not None:
            view.stop()
        demo.close()
    text = result.model_dump_json(indent=2) + "\n"
    (run_dir / "report.json").write_text(text)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(text)
    _summary(console, result, run_dir)
    problems = demo_problems(result)
    for problem in problems:
        console.print(f"[bold red]{problem}[/]")
    if problems:
        raise typer.Exit(1)


def demo_problems(result) -> list[str]:  # noqa: ANN001 - DemoReport
    """What the demo must show and did not (the exit status is 1 if any)."""
    problems = []
    if not result.conserved:
        problems.append("ETH was not conserved: balances moved by more than the gas paid")
    if not result.store_chain_agree:
        problems.append("the store's settled seconds differ from the chain's booking")
    if result.samples_skipped or result.samples_duplicated:
        problems.append(f"{result.samples_skipped} samples skipped, "
                        f"{result.samples_duplicated} duplicated")
    for f in result.faults:
        if f.kind != "join" and ((f.recovery_s is None and not f.after_end) or f.steps_lost):
            problems.append(f"fault {f.kind} of {f.provider} at {f.at_s:.0f} s: recovery "
                            f"{f.recovery_s}, {f.steps_lost} steps lost")
    slashed = {s.provider for s in result.slashes}
    for p in result.providers:
        if p.cheated and (p.name not in slashed or p.paid_wei):
            problems.append(f"the cheat {p.name} was not caught and left unpaid")
        if not p.cheated and p.name in slashed:
            problems.append(f"the honest provider {p.name} was slashed")
    return problems


def _summary(console, result, run_dir: Path) -> None:  # noqa: ANN001
    from rich.table import Table

    table = Table(title=f"shoal demo: {result.scenario}", title_justify="left")
    table.add_column("figure")
    table.add_column("value")
    table.add_row("steps", str(result.steps))
    table.add_row("validation loss", f"{result.val_loss:.3f}" if result.val_loss else "n/a")
    table.add_row("samples skipped / duplicated",
                  f"{result.samples_skipped} / {result.samples_duplicated}")
    for f in result.faults:
        rec = (f"{f.recovery_s:.2f} s" if f.recovery_s is not None else
               "nothing left to recover (at the job's end)" if f.after_end else "n/a")
        table.add_row(f"fault: {f.kind} ({f.provider}) at {f.at_s:.0f} s",
                      f"recovered in {rec}, {f.steps_lost} steps lost")
    for s in result.slashes:
        table.add_row(f"slashed: {s.provider}", f"{s.amount_wei / 1e18:.4f} ETH")
    for p in result.providers:
        table.add_row(f"provider {p.name} ({p.tenancy})",
                      f"{p.steps} steps, paid {p.paid_wei / 1e9:,.2f} gwei"
                      + (f", slashed {p.slashed_wei / 1e18:.4f} ETH" if p.slashed_wei else ""))
    table.add_row("audits", ", ".join(f"{k} {n}" for k, n in sorted(result.verdicts.items()))
                  + f"; the whistleblower re-audited {result.rechecked}")
    for s in result.verifier_slashes:
        table.add_row("verifier penalised", f"{s.address}: {s.why}")
    table.add_row("eta_het", str(result.eta_het))
    if result.ef is not None:
        table.add_row("EF time / cost", f"{result.ef.time} / {result.ef.cost} ({result.ef.how})")
    table.add_row("escrow: budget / spent / refunded",
                  f"{result.budget_wei / 1e18:.6f} / {result.spent_wei / 1e18:.8f} / "
                  f"{result.refunded_wei / 1e18:.6f} ETH")
    table.add_row("ETH conserved", "yes" if result.conserved else "NO")
    table.add_row("store and chain agree", "yes" if result.store_chain_agree else "NO")
    table.add_row("gas used", f"{sum(result.gas.values()):,}")
    console.print(table)
    console.print(f"report: {run_dir / 'report.json'}")
