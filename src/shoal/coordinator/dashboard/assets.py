"""The page's files, shipped in this package and inlined when served, so the
dashboard and the report are each one self-contained page: no CDN, no fonts
or scripts fetched from anywhere."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def asset(name: str) -> str:
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


@cache
def dashboard_page() -> str:
    """dashboard.html with its style and script (the charts, then the page) put in place."""
    return (asset("dashboard.html").replace("/*STYLE*/", asset("style.css"))
            .replace("/*SCRIPT*/", asset("charts.js") + "\n" + asset("dashboard.js")))
