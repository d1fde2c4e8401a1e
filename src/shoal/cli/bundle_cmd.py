"""`shoal bundle SCRIPT`: pack a script, the local modules it imports and its pinned
requirements into the content-addressed bundle a market job of one's own will carry,
and say its hash and what is in it (nothing is sent anywhere)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def bundle_command(
    script: Path = typer.Argument(..., help="The script `shoal run` would take."),
    requirements: Optional[Path] = typer.Option(None, "--requirements", "-r",
                                                help="A requirements file of NAME==VERSION "
                                                     "lines (torch excluded: it is the "
                                                     "provider's)."),
    include: list[Path] = typer.Option([], "--include", help="Another file or directory "
                                       "under the script's directory to carry (repeatable); "
                                       "the local modules it imports are found on their own."),
    data: Optional[str] = typer.Option(None, "--data", help="The data's URL (s3://, https://, "
                                       "...), as the job's workers will read it."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the archive here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Pack a job bundle and print its SHA-256 and contents."""
    from shoal.bundle import pack_bundle

    bundle = pack_bundle(script, requirements=requirements, include=tuple(include), data=data)
    if out is not None:
        out.write_bytes(bundle.archive)
    manifest = bundle.manifest
    if as_json:
        typer.echo(json.dumps({"sha256": bundle.sha256, "bytes": len(bundle.archive),
                               "archive": str(out) if out else None,
                               "manifest": manifest.model_dump()}))
        return
    typer.echo(f"bundle {bundle.sha256} ({len(bundle.archive)} bytes)"
               + (f", written to {out}" if out else ""))
    typer.echo(f"  script        {manifest.script}")
    for entry in manifest.files:
        typer.echo(f"  file          {entry.path} ({entry.size} bytes, {entry.sha256[:12]})")
    for line in manifest.requirements:
        typer.echo(f"  requires      {line}")
    typer.echo(f"  data          {manifest.data or '(none: the script makes its own)'}")
