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
                             "needs --operator and TLS (or --insecure-http)."),
    port: int = typer.Option(8470, "--port", help="TCP port of the API."),
    operator: list[str] = typer.Option([], "--operator", help="Address with the operator role "
                                       "(repeatable)."),
    audience: str = typer.Option("shoal-local", "--audience", help="This coordinator's name in "
                                 "signed requests (give each coordinator its own)."),
    prices: Path = typer.Option(None, "--prices", help="TOML of on-demand reference prices."),
    chain_rpc: str = typer.Option(None, "--chain-rpc", envvar="SHOAL_CHAIN_RPC",
                                  help="Settle on this chain (JSON-RPC URL) as the contract's operator."),
    contract: str = typer.Option(None, "--contract", envvar="SHOAL_LEDGER_CONTRACT",
                                 help="The market contract on --chain-rpc."),
    operator_key: Path = typer.Option(None, "--operator-key", help="File with the contract "
                                      "operator's private key."),
    referee_key: Path = typer.Option(None, "--referee-key", help="File with the contract "
                                     "referee's private key: guilty verdicts are then ruled on "
                                     "by one replay and slashed on chain."),
    forced_error_rate: float = typer.Option(None, "--forced-error-rate", help="Share of "
                                            "records served to verifiers as planted wrong ones "
                                            "(forced errors; default 0.05); 0 plants none."),
    dashboard: bool = typer.Option(False, "--dashboard", help="Serve a live dashboard page at "
                                   "/dashboard (jobs, curves, membership, faults, money, anchors)."),
    tls_cert: Path = typer.Option(None, "--tls-cert", help="Serve HTTPS with this PEM "
                                  "certificate (its chain after it), one your clients' CAs "
                                  "vouch for."),
    tls_key: Path = typer.Option(None, "--tls-key", help="The PEM private key of --tls-cert."),
    tls_self_signed: bool = typer.Option(False, "--tls-self-signed", help="Serve HTTPS with a "
                                         "self-signed certificate made once in the data "
                                         "directory; its SHA-256 is printed at start, for "
                                         "agents and clients to pin "
                                         "(--coordinator-cert-sha256)."),
    insecure_http: bool = typer.Option(False, "--insecure-http", help="Serve plain HTTP beyond "
                                       "loopback: anyone on the path reads and rewrites "
                                       "the API's traffic. Only behind your own TLS proxy."),
) -> None:
    """Run the coordinator: market rounds, agents' heartbeats, jobs, audit log, /metrics."""
    import uvicorn
    from pydantic import ValidationError

    from shoal.coordinator import Coordinator, CoordinatorSettings, create_app
    from shoal.coordinator.tls import served_certificate
    from shoal.errors import ControlError

    values = {"host": host, "port": port, "audience": audience, "operators": tuple(operator),
              "dashboard": dashboard}
    # Only what was given: the SHOAL_COORDINATOR_TLS_* variables fill in the rest.
    for name, value in (("tls_cert_file", tls_cert), ("tls_key_file", tls_key),
                        ("tls_self_signed", tls_self_signed), ("insecure_http", insecure_http)):
        if value:
            values[name] = value
    if forced_error_rate is not None:
        values["forced_error_rate"] = forced_error_rate
    if store:
        values["store_url"] = store
    if prices:
        values["prices_file"] = prices
    if chain_rpc or contract or operator_key:
        values.update(chain_rpc=chain_rpc, ledger_contract=contract, operator_key_file=operator_key)
    try:
        settings = CoordinatorSettings(**values)
    except ValidationError as error:
        raise ControlError("; ".join(e["msg"] for e in error.errors())) from None
    certificate = served_certificate(settings)  # before the store: a wrong file is said first
    settlement = _settlement(settings)
    from shoal.models.gpt_replay import gpt_replayer

    coordinator = Coordinator(settings, settlement=settlement,
                              referee_key=_referee(referee_key, settlement), replayer=gpt_replayer)
    scheme = "http" if certificate is None else "https"
    log.info("coordinator %r on %s://%s:%d (store %s)", settings.audience, scheme,
             _browsable(settings.host), settings.port, coordinator.engine.url.render_as_string())
    if certificate is not None:
        # Printed as well as logged: agents and clients need it before they can trust us.
        typer.echo(f"certificate SHA-256: {certificate.sha256}" + (
            " (self-signed: give it to agents and clients as --coordinator-cert-sha256)"
            if certificate.self_signed else ""))
    if settings.dashboard:
        log.info("dashboard: %s://%s:%d/dashboard", scheme, _browsable(settings.host),
                 settings.port)
    uvicorn.run(create_app(coordinator), host=settings.host, port=settings.port,
                log_level="warning", access_log=False,
                ssl_context_factory=None if certificate is None
                else lambda _config, _default: certificate.context())


def _browsable(host: str) -> str:
    """Where a browser on this machine finds a server bound to `host`."""
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _settlement(settings):  # noqa: ANN001, ANN202 - CoordinatorSettings -> Settlement | None
    """The contract the coordinator operates, if it settles on a chain."""
    if not settings.chain_rpc:
        return None
    from shoal.coordinator.services.settlement import Settlement
    from shoal.client.identity import load_key
    from shoal.ledger import Chain, Ledger

    operator = load_key(str(settings.operator_key_file))
    ledger = Ledger.at(Chain.rpc(settings.chain_rpc), settings.ledger_contract)
    if ledger.roles()["operator"].lower() != operator.address.lower():
        from shoal.errors import ControlError

        raise ControlError(f"{operator.address} is not the operator of {ledger.address}; "
                           "the owner sets it with set_operator")
    log.info("settling on chain %d, contract %s", ledger.chain.chain_id, ledger.address)
    return Settlement(ledger, operator)


def _referee(path: Path | None, settlement):  # noqa: ANN001, ANN202 - -> LocalAccount | None
    if path is None:
        return None
    from shoal.errors import ControlError
    from shoal.client.identity import load_key

    if settlement is None:
        raise ControlError("--referee-key rules on chain: give --chain-rpc, --contract and "
                           "--operator-key too")
    referee = load_key(str(path))
    if settlement.ledger.roles()["referee"].lower() != referee.address.lower():
        raise ControlError(f"{referee.address} is not the referee of {settlement.ledger.address}")
    return referee
