"""`shoal agent`: offer this machine's devices to a coordinator and run the
workers of the leases they win."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import typer

from shoal.cli.market_cmd import CERT_SHA256, KEY, URL, coordinator_client

log = logging.getLogger(__name__)


def agent_command(
    agent_id: str = typer.Option(..., "--agent-id", help="This agent's name (unique per coordinator)."),
    devices: int = typer.Option(1, "--devices", min=1, help="Devices to offer."),
    device_kind: str = typer.Option("cpu", "--device-kind", help="Kind, as in the price table."),
    region: str = typer.Option("local", "--region", help="Where this machine is."),
    price: int = typer.Option(1_000_000, "--price", min=1, help="Asked wei per second per device."),
    on_demand: bool = typer.Option(False, "--on-demand", help="Offer on-demand (never preempted) "
                                   "instead of spot."),
    slowdown: float = typer.Option(1.0, "--slowdown", min=1.0, help="Pose as a device this many "
                                   "times slower (demos and tests)."),
    work_dir: Path = typer.Option(None, "--work-dir", help="Where lease workers run "
                                  "(default runs/agent-ID)."),
    grace_s: float = typer.Option(20.0, "--grace-s", min=0.0, help="Seconds a leaving worker "
                                  "gets to hand over."),
    adversary: str = typer.Option(None, "--adversary", metavar="NAME",
                                  help="Make this provider's workers cheat, to rehearse the "
                                       "verifiers (a built-in of `shoal train --adversary`, or "
                                       "module:callable)."),
    chain_id: int = typer.Option(None, "--chain-id", min=1, help="The chain your stake is on: "
                                 "chain lease terms naming another are not signed."),
    contract: str = typer.Option(None, "--contract", metavar="ADDRESS", help="The market "
                                 "contract your stake is on (with --chain-id): terms naming "
                                 "another are not signed. Without both, no chain lease is."),
    bundled_jobs: bool = typer.Option(True, "--bundled-jobs/--no-bundled-jobs",
                                      help="Run submitters' own code (bundled jobs), each in "
                                           "its own environment and a bubblewrap sandbox."),
    job_disk_gb: float = typer.Option(20.0, "--job-disk-gb", min=0.02, help="The disk each "
                                      "bundled job's lease may fill (a file system of its own)."),
    pip_option: list[str] = typer.Option([], "--pip-option", metavar="OPTION",
                                         help="Passed to pip when a bundled job's environment "
                                              "is built (your index: --index-url=URL; "
                                              "repeatable)."),
    url: str = URL, key: Path = KEY, cert_sha256: str = CERT_SHA256,
) -> None:
    """Pre-flight this machine, offer its devices, run workers for their leases."""
    from shoal.agent import Agent, AgentConfig, ChainPin
    from shoal.errors import ControlError
    from shoal.client.identity import load_key
    from shoal.spec.market import Tenancy

    if key is None:
        raise ControlError("an agent signs as its provider: give --key PATH "
                           "(`shoal key new PATH` makes one)")
    if (chain_id is None) != (contract is None):
        raise ControlError("give --chain-id and --contract together (the chain and contract "
                           "your stake is on), or neither to take off-chain jobs only")
    pin = ChainPin(chain_id, contract) if chain_id is not None else None
    config = AgentConfig(agent_id=agent_id, work_dir=work_dir or Path("runs") / f"agent-{agent_id}",
                         devices=devices, device_kind=device_kind, region=region,
                         price_wei_per_s=price, slowdown=slowdown, grace_s=grace_s,
                         adversary=adversary, chain=pin, bundled_jobs=bundled_jobs,
                         pip_args=tuple(pip_option), job_disk_bytes=int(job_disk_gb * 2**30),
                         tenancy=Tenancy.on_demand if on_demand else Tenancy.spot)
    with coordinator_client(url, load_key(str(key)), cert_sha256) as client:
        agent = Agent(client, config)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: agent.stopping.set())
        agent.enroll()
        log.info("agent %s offers %d device(s) to %s", agent_id, devices, url)
        agent.run()
