"""The HTTP API reference page, from the coordinator app's own OpenAPI description.

The app is built exactly as `shoal coordinator` builds it (`create_app`), over a
coordinator on a throwaway SQLite store, and never served: only `app.openapi()` is read.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

from shoal.coordinator import Coordinator, CoordinatorSettings, create_app

TITLE = "# HTTP API\n\n"
INTRO = """The coordinator's HTTP API, generated from its OpenAPI description when the site
is built. A running coordinator serves the same description at `/openapi.json`. Requests
are signed with the caller's key (`shoal.client.identity`); the CLI and the agent do that
for you.
"""
METHODS = ("get", "post", "put", "patch", "delete")


def openapi() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shoal-docs-") as tmp:
        settings = CoordinatorSettings(store_url=f"sqlite:///{tmp}/store.db", data_dir=tmp)
        coordinator = Coordinator(settings)
        try:
            return create_app(coordinator, run_rounds=False).openapi()
        finally:
            dispose = getattr(getattr(coordinator, "engine", None), "dispose", None)
            if dispose:
                dispose()


def http_page(spec: dict[str, Any] | None = None) -> str:
    spec = spec or openapi()
    common = common_responses(spec)
    parts = [TITLE, INTRO, "\n", f"Version {spec['info']['version']}. "]
    if common:
        parts.append("Every operation may also answer "
                     + ", ".join(f"{code} ({desc})" for code, desc in common.items())
                     + " with a `Problem` body (below); those are not repeated per operation.\n")
    by_tag: dict[str, list[tuple[str, str, dict]]] = {}
    for path, methods in spec["paths"].items():
        for method in METHODS:
            if method in methods:
                op = methods[method]
                by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    for tag, operations in by_tag.items():
        parts.append(f"\n## {tag.capitalize()}\n")
        parts += [operation_section(method, path, op, common) for method, path, op in operations]
    parts.append("\n## Schemas\n\nThe bodies named above, as their JSON schemas describe them.\n")
    parts += [schema_section(name, schema)
              for name, schema in sorted(spec.get("components", {}).get("schemas", {}).items())]
    return "".join(parts)


def common_responses(spec: dict[str, Any]) -> dict[str, str]:
    """The error answers every operation declares (the app's PROBLEMS)."""
    ops = [op for methods in spec["paths"].values() for m, op in methods.items() if m in METHODS]
    shared = set.intersection(*(set(op["responses"]) for op in ops)) if ops else set()
    first = ops[0]["responses"] if ops else {}
    return {code: first[code].get("description", "") for code in sorted(shared)
            if not code.startswith("2")}


def operation_section(method: str, path: str, op: dict, common: dict[str, str]) -> str:
    lines = [f"\n### `{method.upper()} {path}`\n", f"**{op.get('summary', '')}**"]
    if op.get("description"):
        lines += ["", op["description"].strip()]
    params = op.get("parameters", [])
    if params:
        lines += ["", "| Parameter | In | Type | Required |", "| --- | --- | --- | --- |"]
        lines += [f"| `{p['name']}` | {p['in']} | {type_of(p.get('schema', {}))} | "
                  f"{'yes' if p.get('required') else 'no'} |" for p in params]
    body = op.get("requestBody", {}).get("content", {})
    if body:
        lines += ["", "Request body: " + "; ".join(f"{type_of(c.get('schema', {}))} (`{media}`)"
                                                  for media, c in body.items())]
    answers = [f"{code} {answer_of(response)}" for code, response in op["responses"].items()
               if code not in common]
    lines += ["", "Answers: " + "; ".join(answers), ""]
    return "\n".join(lines)


def answer_of(response: dict) -> str:
    content = response.get("content", {})
    if not content:
        return "(no body)"
    return "; ".join(f"{type_of(c.get('schema', {}))} (`{media}`)" for media, c in content.items())


def type_of(schema: dict) -> str:
    """A schema as a short name: a model links to its section below."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{anchor(name)})"
    if "anyOf" in schema:
        kinds = [type_of(s) for s in schema["anyOf"] if s.get("type") != "null"]
        optional = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(kinds) + (" or null" if optional else "")
    if schema.get("type") == "array":
        return f"list of {type_of(schema.get('items', {}))}"
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    if schema.get("format") == "binary":
        return "bytes"
    if schema.get("type") == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        return f"map of {type_of(extra) if isinstance(extra, dict) else 'any'}"
    return schema.get("type", "any")


def anchor(name: str) -> str:
    return "schema-" + name.lower()


def schema_section(name: str, schema: dict) -> str:
    lines = [f"\n### `{name}` {{ #{anchor(name)} }}\n"]
    if schema.get("description"):
        lines += [" ".join(schema["description"].split()), ""]
    if "enum" in schema:
        lines += ["One of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"]) + ".", ""]
    props = schema.get("properties", {})
    if props:
        required = set(schema.get("required", []))
        lines += ["| Field | Type | Required | Description |", "| --- | --- | --- | --- |"]
        lines += [f"| `{field}` | {cell(type_of(p))} | {'yes' if field in required else 'no'} | "
                  f"{cell(p.get('description', ''))} |" for field, p in props.items()]
        lines.append("")
    return "\n".join(lines)


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")
