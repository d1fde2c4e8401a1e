"""A demo run's report (`DemoReport`) as one self-contained HTML page: the
dashboard's plots drawn on the server as inline SVG, and the tables behind
the figures. A pure function of the report; `shoal report RUN_DIR` writes it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from html import escape

from shoal.coordinator.dashboard.assets import asset
from shoal.coordinator.dashboard.curves import loss_points, member_rows, throughput_points
from shoal.coordinator.dashboard.svg import Mark, css_class, line_chart, timeline
from shoal.spec.demo import DemoReport

Cell = object  # str() of it is escaped; a Raw is put in as it is


class Raw(str):
    """HTML made here, not text from the report."""


def render_report(report: DemoReport) -> str:
    t0 = report.started_at
    progress = sorted(report.progress, key=lambda p: p.t)
    xmax = max([report.wall_s, *(p.t - t0 for p in progress),
                *(m.t - t0 for m in report.membership), *(f.at_s for f in report.faults)])
    marks = [Mark(f.at_s, f.kind, f"{f.kind}: {f.provider} at {f.at_s:.1f} s {f.detail}".strip())
             for f in report.faults]
    rows = member_rows(report.membership, t0, xmax)
    sections = [
        _section("Summary", "summary", _summary(report), wide=True),
        _section("Loss", "", Raw(line_chart(
            loss_points(progress, t0), chart_id="loss-chart", path_id="loss-path",
            series="loss", xmax=xmax, marks=marks, y_label="training loss"))),
        _section("Throughput", "", Raw(line_chart(
            throughput_points(progress, t0), chart_id="throughput-chart",
            path_id="throughput-path", series="pace", xmax=xmax, marks=marks,
            y_label="samples/s"))),
        _section("Membership", "", Raw(
            timeline(rows, chart_id="membership", xmax=xmax, marks=marks,
                     epochs=[(m.t - t0, m.epoch) for m in report.membership])
            if rows else '<p id="membership" class="empty">no membership epochs recorded</p>')),
        _section("Faults", "faults", _faults(report)),
        _section("Providers: pay and slash", "providers", _providers(report), wide=True),
        _section("Slashes", "slashes", _table(
            ["provider", "address", "amount (wei)", "transaction", "why"],
            [(s.provider, _hash(s.address), _num(s.amount_wei), _hash(s.tx or "none"), s.why)
             for s in report.slashes])),
        _section("Anchored roots", "anchors", _table(
            ["epoch", "root", "transaction"],
            [(_num(a.epoch), _hash(a.anchored or a.root), _hash(a.tx or "not anchored"))
             for a in report.anchors])),
        _section("Gas per contract function", "gas", _table(
            ["function", "gas"], [(name, _num(gas)) for name, gas in sorted(report.gas.items())])),
    ]
    if report.verdicts:
        sections.append(_section("Verdicts", "verdicts", _table(
            ["kind", "count"], [(k, _num(n)) for k, n in sorted(report.verdicts.items())])))
    started = datetime.fromtimestamp(t0, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    title = f"shoal demo: {report.scenario}"
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{asset('style.css')}</style></head><body>"
            f"<header><h1>{escape(title)}</h1><span class=\"sub\">job {escape(report.job_id)} "
            f"· chain job {report.chain_job} · started {started}</span></header>"
            f"<main>{''.join(sections)}</main></body></html>\n")


def _summary(r: DemoReport) -> Raw:
    ef = r.ef
    figures: list[tuple[str, Cell]] = [
        ("wall time", f"{r.wall_s:.1f} s"), ("steps", r.steps),
        ("validation loss", "none" if r.val_loss is None else f"{r.val_loss:.4f}"),
        ("samples skipped / duplicated", f"{r.samples_skipped} / {r.samples_duplicated}"),
        ("eta_het", "not measured" if r.eta_het is None else f"{r.eta_het:.3f}"),
        ("EF (time)", "not measured" if ef is None else f"{ef.time:.3f}"),
        ("EF (cost)", "not measured" if ef is None else f"{ef.cost:.3f}"),
    ]
    if ef is not None:
        figures += [("static run", f"{ef.static_wall_s:.1f} s, {ef.static_cost_wei} wei, "
                     f"{'measured' if ef.measured else 'estimated'}: {ef.how}")]
    figures += [
        ("budget (wei)", _num(r.budget_wei)), ("spent (wei)", _num(r.spent_wei)),
        ("refunded (wei)", _num(r.refunded_wei)),
        ("money conserved", _verdict(r.conserved, "yes, to the wei")),
        ("store and chain agree", _verdict(r.store_chain_agree,
                                           "yes: the chain booked what the store metered")),
    ]
    return Raw('<dl class="figures">' + "".join(
        f"<dt>{escape(name)}</dt><dd>{_cell(value)}</dd>" for name, value in figures) + "</dl>")


def _verdict(ok: bool, yes: str) -> Raw:
    return Raw(f'<span class="good">{escape(yes)}</span>' if ok else '<span class="bad">NO</span>')


def _faults(r: DemoReport) -> Raw:
    return _table(["at (s)", "kind", "provider", "recovery (s)", "steps lost", "detail"], [
        (_num(f"{f.at_s:.1f}"), Raw(f'<span class="kind {css_class(f.kind)}">{escape(f.kind)}</span>'),
         f.provider, _num("not recovered" if f.recovery_s is None else f"{f.recovery_s:.1f}"),
         _num(f.steps_lost), f.detail) for f in sorted(r.faults, key=lambda f: f.at_s)])


def _providers(r: DemoReport) -> Raw:
    return _table(
        ["provider", "address", "tenancy", "price (wei/s)", "speed (samples/s)", "leased (s)",
         "steps", "paid (wei)", "slashed (wei)", "cheated"],
        [(p.name, _hash(p.address), p.tenancy, _num(p.price_wei_per_s),
          _num(f"{p.speed_samples_per_s:.1f}"), _num(f"{p.leased_s:.1f}"), _num(p.steps),
          _num(p.paid_wei), _num(p.slashed_wei),
          Raw('<span class="bad">yes</span>') if p.cheated else "no") for p in r.providers])


def _section(title: str, section_id: str, body: Raw, wide: bool = False) -> str:
    """A card; `section_id` names it for readers and tests ("" where its chart has one)."""
    attrs = (f' id="{section_id}"' if section_id else "") + (' class="wide"' if wide else "")
    return f"<section{attrs}><h2>{escape(title)}</h2>{body}</section>"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Cell]]) -> Raw:
    rows = list(rows)
    if not rows:
        return Raw('<p class="empty">none</p>')
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return Raw(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


class _Num(Raw):
    pass


class _Hash(Raw):
    pass


def _num(value: object) -> _Num:
    return _Num(escape(str(value)))


def _hash(value: str) -> _Hash:
    return _Hash(escape(value))


def _cell(value: Cell) -> str:
    return value if isinstance(value, Raw) else escape(str(value))


def _td(value: Cell) -> str:
    cls = ' class="num"' if isinstance(value, _Num) else ' class="hash"' if isinstance(
        value, _Hash) else ""
    return f"<td{cls}>{_cell(value)}</td>"
