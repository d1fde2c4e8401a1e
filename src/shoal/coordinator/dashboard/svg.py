"""Small SVG charts drawn on the server for the demo report: a line chart with
fault marks and a membership timeline. No plotting library, nothing fetched;
the dashboard's script draws the same shapes in the browser (dashboard.js)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 60, 14, 14, 30
ROW_PX = 20  # one member's row in a timeline
NAME_PX = 120  # a timeline's left margin: room for a worker's id
LABEL_PX = 48  # a fault's label is about this wide


@dataclass(frozen=True)
class Mark:
    """A fault drawn as a dashed vertical line at `x` seconds."""

    x: float
    kind: str  # its CSS class: kill, preemption, join, cheat, slash, lost, ...
    label: str


@dataclass(frozen=True)
class Row:
    """One member of a timeline and the spans (start_s, end_s) it was a member."""

    name: str
    spans: tuple[tuple[float, float], ...]
    lease: bool = False  # drawn from a lease, not a membership epoch


def css_class(kind: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", kind.lower()) or "other"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round values (1, 2 or 5 times a power of ten) from lo to hi."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def tick_label(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.2g}"


class Frame:
    """Data to pixels: x in [0, xmax] seconds, y in [ylo, yhi] bottom to top."""

    def __init__(self, xmax: float, ylo: float, yhi: float, height: int,
                 left: int = LEFT) -> None:
        self.xmax, self.left = (xmax if xmax > 0 else 1.0), left
        self.ylo, self.yhi = ylo, (yhi if yhi > ylo else ylo + 1.0)
        self.height = height

    def x(self, value: float) -> float:
        return self.left + (WIDTH - self.left - RIGHT) * value / self.xmax

    def y(self, value: float) -> float:
        inner = self.height - TOP - BOTTOM
        return TOP + inner * (1 - (value - self.ylo) / (self.yhi - self.ylo))


def _svg(chart_id: str, height: int, body: list[str]) -> str:
    return (f'<svg id="{escape(chart_id)}" class="chart" viewBox="0 0 {WIDTH} {height}" '
            f'xmlns="http://www.w3.org/2000/svg" role="img">' + "".join(body) + "</svg>")


def _x_axis(frame: Frame, bottom: float) -> list[str]:
    out = [f'<line class="axis" x1="{frame.left}" y1="{bottom}" x2="{WIDTH - RIGHT}" '
           f'y2="{bottom}"/>']
    for tick in nice_ticks(0.0, frame.xmax):
        x = frame.x(tick)
        out.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">'
                   f'{tick_label(tick)}</text>')
    out.append(f'<text x="{WIDTH - RIGHT}" y="{bottom + 26}" text-anchor="end">s</text>')
    return out


def _marks(frame: Frame, marks: Sequence[Mark], top: float, bottom: float) -> list[str]:
    out, last_x, level = [], -1e9, 0
    for mark in sorted(marks, key=lambda m: m.x):
        if not 0 <= mark.x <= frame.xmax:
            continue
        x, kind = frame.x(mark.x), css_class(mark.kind)
        level = level + 1 if x - last_x < LABEL_PX else 0  # close marks: labels step down
        last_x = x
        out.append(f'<line class="mark {kind}" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" '
                   f'y2="{bottom}"><title>{escape(mark.label)}</title></line>')
        out.append(f'<text class="mark-label" x="{x + 3:.1f}" y="{top + 9 + 10 * (level % 4)}">'
                   f'{escape(mark.kind)}</text>')
    return out


def line_chart(points: Sequence[tuple[float, float | None]], *, chart_id: str, path_id: str,
               series: str, xmax: float, marks: Sequence[Mark] = (), y_label: str = "") -> str:
    """A curve of (x seconds, y) points; a None y breaks the line."""
    ys = [y for _, y in points if y is not None and math.isfinite(y)]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    frame = Frame(xmax, lo - pad, hi + pad, HEIGHT)
    bottom = HEIGHT - BOTTOM
    body = []
    for tick in nice_ticks(frame.ylo, frame.yhi, 4):
        y = frame.y(tick)
        body.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" '
                    f'y2="{y:.1f}"/><text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                    f'{tick_label(tick)}</text>')
    body += _x_axis(frame, bottom)
    body.append(f'<text x="{LEFT}" y="{TOP - 3}">{escape(y_label)}</text>')
    body += _marks(frame, marks, TOP, bottom)
    path, pen_down = [], False
    for x, y in points:
        if y is None or not math.isfinite(y):
            pen_down = False
            continue
        path.append(f"{'L' if pen_down else 'M'}{frame.x(x):.1f} {frame.y(y):.1f}")
        pen_down = True
    body.append(f'<path id="{escape(path_id)}" class="series {series}" '
                f'data-points="{len(ys)}" d="{" ".join(path)}"/>')
    return _svg(chart_id, HEIGHT, body)


def timeline(rows: Sequence[Row], *, chart_id: str, xmax: float, marks: Sequence[Mark] = (),
             epochs: Sequence[tuple[float, int]] = ()) -> str:
    """Who was a member when: one row per member, a bar per span; epoch starts dotted."""
    height = TOP + BOTTOM + ROW_PX * max(len(rows), 1)
    frame = Frame(xmax, 0.0, 1.0, height, left=NAME_PX)
    bottom = height - BOTTOM
    body = _x_axis(frame, bottom)
    for x, epoch in epochs:
        body.append(f'<line class="epoch" x1="{frame.x(x):.1f}" y1="{TOP}" '
                    f'x2="{frame.x(x):.1f}" y2="{bottom}"><title>epoch {epoch}</title></line>')
    for i, row in enumerate(rows):
        top = TOP + i * ROW_PX
        body.append(f'<text x="{NAME_PX - 6}" y="{top + 14}" text-anchor="end">'
                    f'{escape(row.name[-20:])}<title>{escape(row.name)}</title></text>')
        for start, end in row.spans:
            x0, x1 = frame.x(max(start, 0.0)), frame.x(min(end, frame.xmax))
            body.append(f'<rect class="bar{" lease" if row.lease else ""}" x="{x0:.1f}" '
                        f'y="{top + 3}" width="{max(x1 - x0, 1.0):.1f}" height="{ROW_PX - 6}">'
                        f'<title>{escape(row.name)}: {start:.1f}-{end:.1f} s</title></rect>')
    body += _marks(frame, marks, TOP, bottom)
    return _svg(chart_id, height, body)
