"""The job-file reference page, from the pydantic models the TOML maps onto
(`shoal.spec.job.JobSpec` and its sections, read by `shoal.spec.jobfile.parse_job`).

A field's description is its pydantic `description`, else the comments the model's
source puts above or beside it: the code's own words, so the page cannot drift.
"""

from __future__ import annotations

import ast
import enum
import inspect
import io
import json
import textwrap
import tokenize
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shoal.spec.job import JobSpec

TITLE = "# Job file\n\n"
INTRO = """A job file is TOML: top-level keys, then one table per section. The commands
that take a `JOB_FILE` (`shoal train`, `shoal submit`, `shoal verify`, ...) read it into
`shoal.spec.job.JobSpec`, which refuses unknown keys, out-of-range values and settings that
contradict each other with one line naming the file. This page is generated from those
models when the site is built; `examples/tiny-gpt.toml` is a complete file.
"""
CONSTRAINTS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"),
               ("min_length", "length ≥"), ("max_length", "length ≤"), ("pattern", "matches"))


def jobfile_page() -> str:
    top = {name: f for name, f in JobSpec.model_fields.items() if not is_section(f)}
    sections = {name: f for name, f in JobSpec.model_fields.items() if is_section(f)}
    parts = [TITLE, INTRO, "\n## Top-level keys\n\n", doc_of(JobSpec), field_table(JobSpec, top)]
    for name, info in sections.items():
        model = info.annotation
        parts += [f"\n## `[{name}]`\n\n", doc_of(model), field_table(model, model.model_fields)]
    return "".join(parts)


def is_section(info: FieldInfo) -> bool:
    return inspect.isclass(info.annotation) and issubclass(info.annotation, BaseModel)


def doc_of(model: type[BaseModel]) -> str:
    doc = inspect.getdoc(model) if model.__doc__ else None
    return f"{doc}\n\n" if doc else ""


def field_table(model: type[BaseModel], fields: dict[str, FieldInfo]) -> str:
    comments = field_comments(model)
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, info in fields.items():
        description = info.description or comments.get(name, "")
        rows.append(f"| `{name}` | {cell(type_text(info))} | {default_text(info)} | "
                    f"{cell(description)} |")
    notes = "".join(enum_notes(name, info) for name, info in fields.items())
    return "\n".join(rows) + "\n" + notes


def enum_notes(name: str, info: FieldInfo) -> str:
    """The values of an enum field that its source explains, one line each."""
    kind = info.annotation
    if not (inspect.isclass(kind) and issubclass(kind, enum.Enum)):
        return ""
    comments = field_comments(kind)
    explained = [f'- `"{member.value}"`: {comments[member.name]}' for member in kind
                 if comments.get(member.name)]
    return f"\n`{name}`:\n\n" + "\n".join(explained) + "\n" if explained else ""


def type_text(info: FieldInfo) -> str:
    text = annotation_text(info.annotation)
    limits = [f"{sign} `{value}`" if key == "pattern" else f"{sign} {value}"
              for meta in info.metadata for key, sign in CONSTRAINTS
              if (value := getattr(meta, key, None)) is not None]
    return ", ".join([text, *limits])


def annotation_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        named = [annotation_text(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" (optional)" if type(None) in args else "")
    if origin is typing.Annotated:
        return annotation_text(args[0])
    if origin in (tuple, list):
        return f"list of {annotation_text(args[0])}" if args else "list"
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return " or ".join(f'`"{member.value}"`' for member in annotation)
    if annotation in (int, float, str, bool):
        return {int: "integer", float: "number", str: "string", bool: "boolean"}[annotation]
    return getattr(annotation, "__name__", str(annotation))


def default_text(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "**required**"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "not set"
    return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field (or enum member) name -> the comment lines directly above its definition
    and beside it."""
    source = textwrap.dedent(inspect.getsource(model))
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body[0].body:
        target = (node.target if isinstance(node, ast.AnnAssign) else
                  node.targets[0] if isinstance(node, ast.Assign) else None)
        if not isinstance(target, ast.Name):
            continue
        above, line = [], node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        found[target.id] = " ".join(above + beside)
    return found


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")
