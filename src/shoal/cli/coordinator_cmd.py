"""`shoal coordinator`: serve the market, its store and its API on one port."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

log = logging.getLogger(__name__)


def coordinator_command(
    store: str = typer.Option(None, "--store", envvar="SHOAL_COORDINATOR_STORE_URL",
                              help="Store URL: sqlite:///PATH (default runs/coordinator/store.db) "
                                   "or postgresql+psycopg://USER@HOST:PORT/DB."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; beyond loopback "
                             "needs --operator."),
    port: int = typer.Option(8470, "--port", help="TCP port of the API."),
    operator: list[str] = typer.Option([], "--operator", help="Address with the operator role "
                                       "(repeatable)."),
    audience: str = typer.Option("shoal-local", "--audience", help="This coordinator's name in "
                                 "signed requests (give each coordinator its own)."),
    prices: Path = typer.Option(None, "--prices", help="TOML of on-demand reference prices."),
) -> None:
    """Run the coordinator: market rounds, agents' heartbeats, jobs, audit log, /metrics."""
    import uvicorn
    from pydantic import ValidationError

    from shoal.control.coordinator import Coordinator, CoordinatorSettings, create_app
    from shoal.control.errors import ControlError

    values = {"host": host, "port": port, "audience": audience, "operators": tuple(operator)}
    if store:
        values["store_url"] = store
    if prices:
        values["prices_file"] = prices
    try:
        settings = CoordinatorSettings(**values)
    except ValidationError as error:
        raise ControlError("; ".join(e["msg"] for e in error.errors())) from None
    coordinator = Coordinator(settings)
    log.info("coordinator %r on http://%s:%d (store %s)", settings.audience, settings.host,
             settings.port, coordinator.engine.url.render_as_string())
    uvicorn.run(create_app(coordinator), host=settings.host, port=settings.port,
                log_level="warning", access_log=False)
