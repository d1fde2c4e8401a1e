"""`shoal chain ...`: inspect a market contract's escrow, anchors, balances, events.

A JSON-RPC node (`--rpc URL --contract ADDRESS`) is the real case. The
embedded chain lives only inside one process, so it is reached through
`shoal chain demo`, which runs a whole job on it and then shows it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import typer

from shoal.ledger.errors import LedgerError

chain_app = typer.Typer(
    help="Inspect the settlement contract: escrow, anchors, balances, events.",
    no_args_is_help=True,
)

RPC = typer.Option(None, "--rpc", envvar="SHOAL_CHAIN_RPC", help="JSON-RPC URL of the chain.")
CONTRACT = typer.Option(None, "--contract", envvar="SHOAL_LEDGER_CONTRACT", help="Market contract address.")
TIMEOUT_S = typer.Option(10.0, "--timeout-s", help="Seconds to wait for the node per request.")
AS_JSON = typer.Option(False, "--json", help="Print JSON instead of text.")
ETHER = 10**18


def _ledger(rpc: str | None, contract: str | None, timeout_s: float) -> Any:
    from shoal.ledger import Chain, Ledger

    if not rpc or rpc == "embedded":
        raise LedgerError(
            "the embedded chain lives only inside one process: run `shoal chain demo`, "
            "or pass --rpc URL --contract ADDRESS (or set SHOAL_CHAIN_RPC / SHOAL_LEDGER_CONTRACT)"
        )
    if not contract:
        raise LedgerError("pass --contract ADDRESS (or set SHOAL_LEDGER_CONTRACT); `shoal chain deploy` prints one")
    return Ledger.at(Chain.rpc(rpc, timeout_s), contract)


def _eth(wei: int) -> str:
    return f"{wei / ETHER:.6f} ETH ({wei} wei)"


def _emit(shown: tuple[Any, list[str]], as_json: bool) -> None:
    data, lines = shown
    typer.echo(json.dumps(data, indent=1) if as_json else "\n".join(lines))


def _leases(ledger: Any, job: int) -> list[dict[str, Any]]:
    """Each lease of `job` as its events tell it (a paid lease's storage is cleared)."""
    rows: dict[str, dict[str, Any]] = {}
    for e in ledger.events(job=job):
        provider = e.args.get("provider")
        if e.name == "LeaseOpened":
            rows[provider] = {"provider": provider, "price_wei_per_s": e.args["price"],
                              "term_s": e.args["term_s"], "locked_wei": e.args["locked"], "verified_s": 0, "paid_wei": 0}
        elif e.name == "LeaseAccepted":
            rows[provider]["locked_wei"] = e.args["locked"]
        elif e.name == "WorkBooked":
            rows[provider]["verified_s"] += e.args["seconds"]
        elif e.name == "Paid":
            rows[provider]["paid_wei"] += e.args["amount"]
    for row in rows.values():
        lease = ledger.lease(job, row["provider"])
        row["state"] = ("slashed" if lease.slashed else "disputed" if lease.disputed
                        else "offered" if lease.unpaid and not lease.accepted_at
                        else "unpaid" if lease.unpaid else "paid")
    return list(rows.values())


def show_status(ledger: Any, job: int) -> tuple[Any, list[str]]:
    escrow = ledger.job(job)
    leases = _leases(ledger, job)
    lines = [
        f"job {job} on {ledger.address}: {escrow.state.value}",
        f"  submitter   {escrow.submitter}",
        f"  escrow      {_eth(escrow.escrow_wei)}",
        f"  owed        {_eth(escrow.owed_wei)} for verified work",
        f"  max price   {escrow.max_price_wei_per_s} wei/s",
        f"  epochs      {escrow.epochs} anchored",
    ]
    lines += [f"  lease {x['provider']}: {x['price_wei_per_s']} wei/s x {x['verified_s']} s "
              f"(term {x['term_s']} s, collateral {x['locked_wei']} wei), {x['state']}, "
              f"paid {x['paid_wei']} wei" for x in leases]
    return {"job": escrow.model_dump(mode="json"), "leases": leases}, lines


def show_anchors(ledger: Any, job: int) -> tuple[Any, list[str]]:
    anchors = ledger.anchors(job)
    lines = [f"job {job}: {len(anchors)} anchored epochs"]
    lines += [f"  epoch {a.epoch:>4}  {a.root}" for a in anchors]
    return [a.model_dump() for a in anchors], lines


def show_balances(ledger: Any, accounts: list[str], names: dict[str, str] | None = None) -> tuple[Any, list[str]]:
    names = names or {}
    if not accounts:  # everyone the contract has heard of
        seen: dict[str, None] = {}
        for e in ledger.events():
            for key in ("submitter", "provider", "challenger", "whistleblower", "account"):
                if isinstance(e.args.get(key), str):
                    seen[e.args[key]] = None
        accounts = [*ledger.roles().values(), *seen]
    rows = []
    for account in dict.fromkeys(accounts):
        stake = ledger.stake_of(account)
        rows.append({"account": account, "name": names.get(account, ""), "balance_wei": ledger.chain.balance(account),
                     "credit_wei": ledger.credit_of(account), "stake_wei": stake.active_wei,
                     "locked_wei": stake.locked_wei, "unbonding_wei": stake.unbonding_wei})
    lines = [f"contract {ledger.address} holds {_eth(ledger.balance())}"]
    lines += [f"  {r['name']:<13} {r['account']}  balance {_eth(r['balance_wei'])}  credit {r['credit_wei']} wei  "
              f"stake {r['stake_wei']} wei (locked {r['locked_wei']})  unbonding {r['unbonding_wei']} wei" for r in rows]
    return {"contract_wei": ledger.balance(), "accounts": rows}, lines


def show_events(ledger: Any, job: int | None, from_block: int) -> tuple[Any, list[str]]:
    events = ledger.events(job=job, from_block=from_block)
    lines = [f"{e.block:>6}  {e.name:<16} " + " ".join(f"{k}={v}" for k, v in e.args.items())
             for e in events] or ["no events"]
    return [e.model_dump() for e in events], lines


@chain_app.command("status")
def status_command(job: int = typer.Option(..., "--job", help="Job id."), rpc: str = RPC,
                   contract: str = CONTRACT, timeout_s: float = TIMEOUT_S, as_json: bool = AS_JSON) -> None:
    """A job's escrow, what it owes, its anchors and its leases."""
    _emit(show_status(_ledger(rpc, contract, timeout_s), job), as_json)


@chain_app.command("anchors")
def anchors_command(job: int = typer.Option(..., "--job", help="Job id."), rpc: str = RPC,
                    contract: str = CONTRACT, timeout_s: float = TIMEOUT_S, as_json: bool = AS_JSON) -> None:
    """The Merkle root anchored for each epoch of a job."""
    _emit(show_anchors(_ledger(rpc, contract, timeout_s), job), as_json)


@chain_app.command("balances")
def balances_command(accounts: list[str] = typer.Argument(None, help="Accounts (default: all seen)."),
                     rpc: str = RPC, contract: str = CONTRACT, timeout_s: float = TIMEOUT_S,
                     as_json: bool = AS_JSON) -> None:
    """ETH balance, withdrawable credit and stake of accounts, and what the contract holds."""
    _emit(show_balances(_ledger(rpc, contract, timeout_s), list(accounts or [])), as_json)


@chain_app.command("events")
def events_command(job: int = typer.Option(None, "--job", help="Only this job's events."),
                   from_block: int = typer.Option(0, "--from-block", min=0), rpc: str = RPC,
                   contract: str = CONTRACT, timeout_s: float = TIMEOUT_S, as_json: bool = AS_JSON) -> None:
    """Every state change the contract logged, oldest first."""
    _emit(show_events(_ledger(rpc, contract, timeout_s), job, from_block), as_json)


@chain_app.command("deploy")
def deploy_command(rpc: str = RPC, timeout_s: float = TIMEOUT_S,
                   operator: str = typer.Option(None, "--operator", help="Operator address (default: deployer)."),
                   referee: str = typer.Option(None, "--referee", help="Referee address (default: deployer)."),
                   fee_bps: int = typer.Option(0, "--fee-bps", min=0, max=10_000)) -> None:
    """Deploy a market; the key comes from SHOAL_LEDGER_KEY, or a dev node's first account."""
    from eth_account import Account

    from shoal.ledger import Chain, Ledger
    from shoal.spec.ledger import LedgerConfig

    if not rpc:
        raise LedgerError("pass --rpc URL: a contract on the embedded chain would vanish with this process")
    chain = Chain.rpc(rpc, timeout_s)
    key = os.environ.get("SHOAL_LEDGER_KEY")
    owner = Account.from_key(key) if key else chain.dev_accounts()[0]
    ledger = Ledger.deploy(chain, owner, operator or owner.address, referee or owner.address,
                           LedgerConfig(fee_bps=fee_bps))
    typer.echo(ledger.address)


@chain_app.command("demo")
def demo_command(providers: int = typer.Option(3, "--providers", min=2, max=5),
                 epochs: int = typer.Option(2, "--epochs", min=1, max=100),
                 rpc: str = typer.Option(None, "--rpc", help="Run on this dev node instead of in-process."),
                 as_json: bool = AS_JSON) -> None:
    """Run a job's settlement on the embedded chain (or a dev node), then show it."""
    from shoal.ledger import Chain
    from shoal.ledger.demo import run_demo

    result = run_demo(Chain.connect(rpc), providers=providers, epochs=epochs)
    names = {address: name for name, address in result.accounts.items()}
    parts = {
        "status": show_status(result.ledger, result.job),
        "anchors": show_anchors(result.ledger, result.job),
        "balances": show_balances(result.ledger, list(names), names),
        "events": show_events(result.ledger, None, 0),
    }
    if as_json:
        data = {"market": result.ledger.address, "slashed": result.cheat}
        typer.echo(json.dumps(data | {k: v[0] for k, v in parts.items()}, indent=1))
        return
    typer.echo(f"market {result.ledger.address}; provider {result.cheat} was caught and slashed")
    for _, lines in parts.values():
        typer.echo("\n" + "\n".join(lines))
