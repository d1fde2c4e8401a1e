"""The CLI reference page, from the typer app itself (`shoal.cli.main.app`).

Each command's help, usage and options are what `shoal COMMAND --help` prints, so the
page cannot drift from the code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer

from shoal.cli.main import app

TITLE = "# Command line\n\n"
INTRO = ("Every `shoal` command, its arguments and options, as `shoal COMMAND --help` "
         "prints them (generated from the code when the site is built).\n")


def cli_page() -> str:
    root = typer.main.get_command(app)
    sections = [command_section(path, command, ctx) for path, command, ctx in walk(root, ["shoal"])]
    return TITLE + INTRO + "\n" + "\n".join(sections)


def walk(command: Any, path: list[str], parent: Any = None) -> Iterator[tuple[list[str], Any, Any]]:
    """Every command under `command`, depth first in the order `--help` lists them.

    Duck-typed: typer ships its own copy of click, so these are not `click` classes."""
    ctx = command.context_class(command, info_name=path[-1], parent=parent)
    if not command.hidden:
        yield path, command, ctx
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            yield from walk(command.get_command(ctx, name), [*path, name], ctx)


def command_section(path: list[str], command: Any, ctx: Any) -> str:
    usage = " ".join([*path, *command.collect_usage_pieces(ctx)])
    usage = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), usage)  # typer's {job_file}
    rows = [record for param in command.params
            if not getattr(param, "hidden", False) and (record := param.get_help_record(ctx))]
    if hasattr(command, "list_commands"):
        rows += [(f"{name}", (command.get_command(ctx, name).get_short_help_str(limit=200)))
                 for name in command.list_commands(ctx)]
    lines = [f"{'#' * min(len(path) + 1, 4)} `{' '.join(path)}`", "", help_text(command.help), "",
             "```", usage, "```", ""]
    if rows:
        lines += ["| Argument, option or command | Description |", "| --- | --- |"]
        lines += [f"| `{' '.join(opts.split())}` | {cell(text)} |" for opts, text in rows]
        lines.append("")
    return "\n".join(lines)


def help_text(text: str | None) -> str:
    """A docstring's paragraphs as markdown (click's \\b no-rewrap markers dropped)."""
    text = "\n".join(line for line in (text or "").splitlines() if line.strip() != "\b")
    return escape(text.strip())


def escape(text: str) -> str:
    """`text` as literal markdown: `<path>` is not an HTML tag; code spans stay as typed."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else
                   part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                   for part in parts)


def cell(text: str) -> str:
    return escape(" ".join(text.split())).replace("|", "\\|")
