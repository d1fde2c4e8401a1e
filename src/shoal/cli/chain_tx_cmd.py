"""`shoal chain create-job | fund | stake | withdraw`: the transactions a
submitter or a provider sends itself, signed with its own key file."""

from __future__ import annotations

from pathlib import Path

import typer

from shoal.cli.chain_cmd import CONTRACT, RPC, TIMEOUT_S, _ledger, chain_app

KEY = typer.Option(..., "--key", envvar="SHOAL_KEY", help="File with your private key.")


def _signed(rpc: str | None, contract: str | None, timeout_s: float, key: Path):  # noqa: ANN202
    from shoal.control.identity import load_key

    return _ledger(rpc, contract, timeout_s), load_key(str(key))


@chain_app.command("create-job")
def create_job_command(deposit: int = typer.Option(..., "--deposit", min=1, help="Escrow, in wei."),
                       max_price: int = typer.Option(..., "--max-price", min=1,
                                                     help="Most wei per second per provider."),
                       key: Path = KEY, rpc: str = RPC, contract: str = CONTRACT,
                       timeout_s: float = TIMEOUT_S) -> None:
    """Open a job with its escrow; prints its id (give it to `shoal submit --chain-job`)."""
    ledger, account = _signed(rpc, contract, timeout_s, key)
    typer.echo(ledger.create_job(account, max_price, deposit).returned)


@chain_app.command("fund")
def fund_command(job: int = typer.Option(..., "--job"), amount: int = typer.Option(..., "--amount", min=1),
                 key: Path = KEY, rpc: str = RPC, contract: str = CONTRACT,
                 timeout_s: float = TIMEOUT_S) -> None:
    """Add to a job's escrow (then `shoal top-up` tells the coordinator)."""
    ledger, account = _signed(rpc, contract, timeout_s, key)
    ledger.fund(account, job, amount)
    typer.echo(f"job {job}: escrow {ledger.job(job).escrow_wei} wei")


@chain_app.command("stake")
def stake_command(amount: int = typer.Option(..., "--amount", min=1, help="Wei to stake."),
                  key: Path = KEY, rpc: str = RPC, contract: str = CONTRACT,
                  timeout_s: float = TIMEOUT_S) -> None:
    """Stake as a provider: accepted leases lock collateral from it."""
    ledger, account = _signed(rpc, contract, timeout_s, key)
    ledger.stake(account, amount)
    typer.echo(f"{account.address}: {ledger.stake_of(account.address).active_wei} wei staked")


@chain_app.command("withdraw")
def withdraw_command(key: Path = KEY, rpc: str = RPC, contract: str = CONTRACT,
                     timeout_s: float = TIMEOUT_S) -> None:
    """Take out all of your credit: earnings, refunds, released stake."""
    ledger, account = _signed(rpc, contract, timeout_s, key)
    credit = ledger.credit_of(account.address)
    ledger.withdraw(account)
    typer.echo(f"{account.address}: withdrew {credit} wei")
