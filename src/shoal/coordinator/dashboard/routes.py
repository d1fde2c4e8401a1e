"""GET /dashboard: the live dashboard page, served by the coordinator when its
settings say `dashboard` (`shoal coordinator --dashboard`). The page reads
only the public JSON API, so it needs no route of its own beyond this one."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from shoal.coordinator.dashboard.assets import dashboard_page

PATH = "/dashboard"
# What the page may do: run its own inline script and style, and read this origin's API.
POLICY = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
          "connect-src 'self'; img-src 'self' data:")


def dashboard_routes(app: FastAPI) -> None:
    # HTML, not an API operation: kept out of /openapi.json (and so out of the fuzzer's way).
    @app.get(PATH, include_in_schema=False, response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_page(), headers={"cache-control": "no-cache",
                                                       "content-security-policy": POLICY})
