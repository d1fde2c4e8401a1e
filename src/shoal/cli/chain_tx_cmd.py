"""`shoal chain create-job | fund | stake | withdraw`: the transactions a
submitter or a provider sends itself, signed with its own key file."""

from __future__ import annotations

from pathlib import Path

import typer

from shoal.cli.chain_cmd import CONTRACT, RPC, TIMEOUT_S, _ledger, chain_app

KEY = typer.Option(..., "--key", envvar="SHOAL_KEY", help="File with your private key.")


def _signed(rpc: str | None, contract: str | None, timeout_s: float, key: Path):  # noqa: ANN202
    from shoal.client.identity import load_key

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


@chain_app.command("anchor-records")
def anchor_records_command(
        job_file: Path = typer.Argument(..., help="The job file whose work records to anchor."),
        job: int = typer.Option(..., "--job", help="The job's id on chain."),
        key: Path = KEY, rpc: str = RPC, contract: str = CONTRACT,
        timeout_s: float = TIMEOUT_S) -> None:
    """As the operator: anchor the Merkle root of each complete proof epoch not yet
    anchored, in order (what `shoal verify --chain-job` then checks records against)."""
    from shoal import ShoalError
    from shoal.proof.epochs import by_epoch, is_complete
    from shoal.proof.merkle import epoch_tree
    from shoal.spec import load_job
    from shoal.verify.proof_store import ProofStore

    spec = load_job(job_file)
    ledger, account = _signed(rpc, contract, timeout_s, key)
    store = ProofStore(spec.proof_dir)
    grouped = by_epoch(store.records(), spec.proof.epoch_steps)
    anchored = ledger.job(job).epochs
    ready = [e for e in sorted(grouped) if e >= anchored
             and is_complete(grouped[e], e, spec.proof.epoch_steps, spec.steps)]
    if ready[:1] and ready[0] != anchored:
        raise ShoalError(f"job {job} has {anchored} anchored epoch(s) but the records start at "
                         f"epoch {ready[0]}: epochs are anchored in order")
    for epoch in ready:
        if epoch != anchored:
            break  # a gap: an incomplete epoch waits for its records
        tree, ordered = epoch_tree(grouped[epoch])
        root = tree.root
        ledger.anchor(account, job, epoch, root)
        store.save_anchor(epoch, root, [r.leaf() for r in ordered])
        typer.echo(f"job {job} epoch {epoch}: anchored {root.hex()}")
        anchored += 1
    if not ready:
        typer.echo(f"job {job}: nothing new to anchor ({anchored} epoch(s) on chain)")
