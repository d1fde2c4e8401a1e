"""Errors of the shared vocabulary: a value that does not fit the spec.

Turns pydantic's nested validation errors into one line that names the
field, the bad value and the allowed range, so the CLI can print it as is.
"""

from __future__ import annotations

from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError

from shoal import ShoalError


class SpecError(ShoalError):
    """A job file or value that does not match the spec."""


def _field_bounds(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The allowed range of the field at `loc`, as 'a to b', or ''."""
    current: Any = model
    field = None
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return ""
        field = fields[part]
        current = field.annotation
    if field is None:
        return ""
    low = high = None
    for meta in field.metadata:
        if isinstance(meta, Ge):
            low = f"{meta.ge}"
        elif isinstance(meta, Gt):
            low = f"more than {meta.gt}"
        elif isinstance(meta, Le):
            high = f"{meta.le}"
        elif isinstance(meta, Lt):
            high = f"less than {meta.lt}"
    if low and high:
        return f"allowed {low} to {high}"
    if low:
        return f"allowed {low} or more" if not low.startswith("more") else f"allowed {low}"
    if high:
        return f"allowed up to {high}"
    return ""


def describe_validation_error(
    error: ValidationError, model: type[BaseModel], source: str
) -> str:
    """One line for the first problem in `error`, naming `source` and the field."""
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        if item["type"] == "extra_forbidden":
            section = ".".join(str(p) for p in loc[:-1])
            hint = f" in [{section}]" if section else ""
            problems.append(f"unknown key '{loc[-1]}'{hint}; check the spelling")
            continue
        if item["type"] == "missing":
            problems.append(f"'{where}' is required")
            continue
        bounds = _field_bounds(model, loc)
        value = item.get("input")
        shown = f" = {value!r}" if not isinstance(value, dict) else ""
        message = item["msg"]
        if bounds:
            message = f"out of range ({bounds})"
        problems.append(f"'{where}'{shown}: {message}")
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{source}: {problems[0]}{more}"
