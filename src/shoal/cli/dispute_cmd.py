"""`shoal dispute`: challenge one worker's proof epoch with a bond on the
contract; the coordinator bisects, its referee replays the one step left,
and the contract pays the winner (exit status 1 when the dispute is lost)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Optional

import typer

from shoal.cli.market_cmd import CERT_SHA256, coordinator_client
from shoal.spec.proof import Ruling


def dispute_command(
    job_id: str = typer.Option(..., "--job", help="The market job's id."),
    worker: str = typer.Option(..., "--worker", help="The worker whose epoch is disputed."),
    epoch: int = typer.Option(..., "--epoch", min=0, help="The proof epoch."),
    key: Path = typer.Option(..., "--key", help="The challenger's key: it signs the bond's "
                             "transaction and the filing (create one with `shoal key new`)."),
    bond_wei: Optional[int] = typer.Option(None, "--bond-wei", min=1, help="The bond (default: "
                                           "the contract's minimum). Lost if the dispute is."),
    coordinator: str = typer.Option(..., "--coordinator", envvar="SHOAL_COORDINATOR_URL",
                                    help="The coordinator that runs the job."),
    cert_sha256: Optional[str] = CERT_SHA256,
    rpc: Optional[str] = typer.Option(None, "--rpc", envvar="SHOAL_CHAIN_RPC",
                                      help="The chain's JSON-RPC URL."),
    contract: Optional[str] = typer.Option(None, "--contract", envvar="SHOAL_LEDGER_CONTRACT",
                                           help="The settlement contract's address."),
    answer_wait_s: float = typer.Option(60.0, "--answer-wait-s", min=0.1,
                                        help="How long to wait for agents to send the files."),
    ruling_wait_s: float = typer.Option(300.0, "--ruling-wait-s", min=0.0,
                                        help="How long to wait for the referee's ruling."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Replay every record of WORKER in proof epoch EPOCH; if a step does not replay as
    committed, open a dispute on the contract (your bond) and bring it to the coordinator.

    Raising challenges for the files takes the verifier role at the coordinator
    (`shoal grant`); the dispute itself needs only the bond."""
    from shoal.cli.chain_cmd import _ledger
    from shoal.cli.verify_cmd import remote_auditor
    from shoal.client.identity import load_key
    from shoal.verify.roles.challenger import challenge_worker
    from shoal.verify.roles.remote import RemoteAudits

    account = load_key(str(key))
    ledger = _ledger(rpc, contract, 30.0)
    bond = bond_wei if bond_wei is not None else ledger.config().min_bond_wei
    with coordinator_client(coordinator, account, cert_sha256) as client:
        job, auditor = remote_auditor(client, job_id, account.address, "challenger")
        audits = RemoteAudits(client, job_id, job, auditor, account, salt=secrets.token_bytes(16),
                              answer_wait_s=answer_wait_s)
        found = challenge_worker(client, ledger, account, audits, job_id, worker, epoch, bond,
                                 ruling_wait_s=ruling_wait_s)
    rejected = sorted(v.step for v in found.verdicts if v.guilty)
    view = found.dispute
    if as_json:
        typer.echo(json.dumps({"replayed": len(found.verdicts), "rejected_steps": rejected,
                               "dispute": view.model_dump(mode="json") if view else None}))
    elif view is None:
        typer.echo(f"{len(found.verdicts)} records of {worker} in epoch {epoch} replay as "
                   "committed: nothing to dispute, no bond spent")
    else:
        typer.echo(f"replays reject steps {rejected}; dispute {view.dispute} opened with "
                   f"{bond} wei: {view.ruling or 'not ruled yet'}"
                   + (f" at step {view.step} ({view.why})" if view.ruling else ""))
    if view is not None and view.ruling is Ruling.rejected:
        raise typer.Exit(1)
