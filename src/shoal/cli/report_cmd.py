"""`shoal report RUN_DIR`: a demo run's report.json as one HTML page with its
plots (inline SVG), to read or hand on without a coordinator or a browser
fetching anything."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from shoal import ShoalError


def report_command(
    run_dir: Path = typer.Argument(..., help="A demo run's directory (holds report.json)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write the page "
                                                           "(default RUN_DIR/report.html)."),
) -> None:
    """Render RUN_DIR/report.json (a demo's report) as an HTML page with plots."""
    from shoal.coordinator.dashboard.report_html import render_report
    from shoal.spec.demo import DemoReport

    source = run_dir / "report.json"
    if not source.is_file():
        raise ShoalError(f"{source} not found: give the directory of a demo run "
                         "(`shoal demo` writes report.json there)")
    try:
        report = DemoReport.model_validate_json(source.read_bytes())
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        raise ShoalError(f"{source} is not a demo report ({error.error_count()} problems; "
                         f"{where}: {first['msg']})") from None
    target = out or run_dir / "report.html"
    try:
        target.write_text(render_report(report), encoding="utf-8")
    except OSError as error:
        raise ShoalError(f"cannot write {target}: {error.strerror}") from None
    typer.echo(str(target))
