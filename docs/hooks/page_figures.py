"""The figures page: each bench's latest recorded result and the history of its headline
figures, from `bench/results/NAME.jsonl` (what `--record` appends, see bench/history.py).

Charts are inline SVG drawn here, so the site needs no plotting library or JavaScript.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TITLE = "# Figures\n\n"
INTRO = """Each bench's latest recorded result and the history of its headline figures,
generated when the site is built from `bench/results/NAME.jsonl`. A bench adds a line
there only when run with `--record`; its command, commit and date are kept with it.
A commit ending in `+dirty` ran with changes no commit holds.
"""
EMPTY = "No bench results are recorded yet: run a bench with `--record` (see `bench/`).\n"


@dataclass(frozen=True)
class Headline:
    """What to show of one bench: `variant` splits its history by a field whose runs are
    not comparable (a kill is not a stall); each path is a dotted key, `*` for every key
    at that level, and a path ending at an object shows each of its numbers."""

    paths: tuple[str, ...]
    variant: str | None = None
    lowest: tuple[str, ...] = field(default=())  # objects shown as their smallest number


HEADLINES = {
    "elastic": Headline(("rto_s", "rto_full_s", "pause_s", "lost_s", "steps_lost",
                         "torchft_rto_s", "torchft_rto_full_s", "torchft_pause_s",
                         "torchrun_rto_s", "torchrun_rto_full_s", "torchrun_pause_s",
                         "overhead"), variant="fault"),
    "proof": Headline(("false_positives", "overhead", "pol_overhead", "audit_rate",
                       "sent_check_cost"), variant="sync", lowest=("detection",)),
    "churn": Headline(("efficiency", "torchft_efficiency", "rto_s_median",
                       "torchft_rto_s_median", "steps_lost")),
    "chain": Headline(("settle_gas_per_provider", "job_gas_per_provider",
                       "job_gas_per_provider_with_withdraw_each_job", "anchors_per_s")),
    "coordinator": Headline(("p50_ms", "p99_ms", "lost", "healthz_p99_ms"), variant="store"),
    "gate": Headline(("direct_step_ms", "gated_step_ms", "added_ms")),
    "het": Headline(("eta_het", "eta_het_equal_shares", "eta_bound_of_shares")),
    "local_rounds": Headline(("every_step_val_loss",), lowest=("runs.*.gap",)),
    "plan": Headline(("vs_optimum_worst", "vs_random.world-wide", "plan_s_1024")),
    "robust": Headline(("honest_val_loss", "floor_gap", "loss_gap", "throughput_cost")),
    "slt": Headline(("runs.*.speedup",)),
    "wan": Headline(("slowdown", "bytes_ratio", "loss_gap", "fast.time_to_target_s",
                     "slow.time_to_target_s")),
}


def figures_page(results_dir: Path) -> str:
    files = sorted(results_dir.glob("*.jsonl"))
    sections = [bench_section(path.stem, read_lines(path)) for path in files]
    sections = [s for s in sections if s]
    return TITLE + INTRO + "\n" + ("\n".join(sections) if sections else EMPTY)


def read_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if text.strip():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON line ({error})") from None
    return lines


def bench_section(bench: str, lines: list[dict[str, Any]]) -> str:
    if not lines:
        return ""
    headline = HEADLINES.get(bench, Headline(tuple(k for k, v in lines[-1].items()
                                                   if is_number(v))))
    groups: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        key = str(line.get(headline.variant, "")) if headline.variant else ""
        groups.setdefault(key, []).append(line)
    parts = [f"## {bench}\n"]
    for variant, runs in groups.items():
        if variant:
            parts.append(f"\n### {bench}: {headline.variant} = {variant}\n")
        parts.append(latest_section(runs, headline))
    return "\n".join(parts)


def latest_section(runs: list[dict[str, Any]], headline: Headline) -> str:
    latest = runs[-1]
    figures = headline_values(latest, headline)
    out = [f"\nLatest of {len(runs)} recorded run{'s' if len(runs) != 1 else ''}: commit "
           f"`{latest.get('commit', '?')}`, {latest.get('date', '?')}.\n",
           f"```\n{latest.get('command', '?')}\n```\n",
           "| Figure | Latest | History |", "| --- | --- | --- |"]
    for label, value in figures.items():
        history = [(run, headline_values(run, headline).get(label)) for run in runs]
        out.append(f"| `{label}` | {shown(value)} | {chart(label, history)} |")
    return "\n".join(out) + "\n"


def headline_values(line: dict[str, Any], headline: Headline) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in headline.paths:
        values.update(numbers_at(line, path))
    for path in headline.lowest:
        found = [v for v in numbers_at(line, path).values() if is_number(v)]
        values[f"lowest {path}"] = min(found) if found else None
    return values


def numbers_at(obj: Any, path: str) -> dict[str, Any]:
    """Every value at dotted `path` in `obj` (`*`: each key), objects opened to numbers."""
    found: dict[str, Any] = {}

    def visit(value: Any, keys: list[str], label: list[str]) -> None:
        if not keys:
            if isinstance(value, dict):
                for k, v in value.items():
                    if is_number(v) or v is None:
                        found[".".join([*label, str(k)])] = v
            else:
                found[".".join(label)] = value
            return
        if not isinstance(value, dict):
            return
        head, rest = keys[0], keys[1:]
        for k in (value if head == "*" else [head] if head in value else []):
            visit(value[k], rest, [*label, str(k)])

    visit(obj, path.split("."), [])
    return found


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def shown(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def chart(label: str, history: list[tuple[dict[str, Any], Any]], width: int = 240,
          height: int = 60) -> str:
    """A polyline of `label` over the recorded runs, oldest left; each point's tooltip
    names its run. One line of SVG, so it sits in a table cell."""
    points = [(i, float(v), run) for i, (run, v) in enumerate(history) if is_number(v)]
    if not points:
        return ""
    pad, left, n = 6, 40, max(len(history) - 1, 1)  # left: the axis labels' margin
    low, high = min(v for _, v, _ in points), max(v for _, v, _ in points)
    span = high - low

    def xy(i: int, v: float) -> tuple[float, float]:
        x = left + (width - left - pad) * (i / n if len(history) > 1 else 0.5)
        y = height / 2 if span == 0 else height - pad - (height - 2 * pad) * (v - low) / span
        return round(x, 1), round(y, 1)

    coords = [xy(i, v) for i, v, _ in points]
    dots = "".join(f'<circle cx="{x}" cy="{y}" r="2.5"><title>'
                   f'{html.escape(tip(label, v, run))}</title></circle>'
                   for (x, y), (_, v, run) in zip(coords, points))
    line = " ".join(f"{x},{y}" for x, y in coords)
    labels = ([(height / 2 + 3, low)] if span == 0 else [(pad + 4, high), (height - 2, low)])
    axis = "".join(f'<text x="{left - 4}" y="{y}" text-anchor="end" font-size="9">'
                   f'{shown(value)}</text>' for y, value in labels)
    return (f'<svg class="shoal-chart" role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" aria-label="{html.escape(label)} over '
            f'{len(points)} runs: {shown(low)} to {shown(high)}">{axis}'
            f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{line}"/>'
            f'<g fill="currentColor">{dots}</g></svg>')


def tip(label: str, value: float, run: dict[str, Any]) -> str:
    return f"{label} = {shown(value)} at {run.get('commit', '?')}, {run.get('date', '?')}"
