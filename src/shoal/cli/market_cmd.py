"""`shoal submit | jobs | providers | events | top-up | cancel | key new`: the
coordinator's API from the command line, signed with the caller's key."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

URL = typer.Option("http://127.0.0.1:8470", "--coordinator", envvar="SHOAL_COORDINATOR_URL",
                   help="The coordinator's URL (https:// where it serves TLS).")
CERT_SHA256 = typer.Option(None, "--coordinator-cert-sha256", metavar="HEX",
                           envvar="SHOAL_COORDINATOR_CERT_SHA256", help="Trust the https coordinator's certificate "
                           "by this SHA-256 alone (a self-signed one: the coordinator prints "
                           "it when it starts); without it, this machine's CAs must vouch.")
KEY = typer.Option(None, "--key", envvar="SHOAL_KEY", help="File with your private key "
                   "(`shoal key new PATH` makes one).")
AS_JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")
key_app = typer.Typer(help="Keys that sign your requests to a coordinator.", no_args_is_help=True)


def _client(url: str, key: Path | None = None, cert_sha256: str | None = None):  # noqa: ANN202
    from shoal.client.identity import load_key

    return coordinator_client(url, load_key(str(key)) if key else None, cert_sha256)


def coordinator_client(url: str, account, cert_sha256: str | None):  # noqa: ANN001, ANN201
    """A client of the coordinator at `url`, trusting the certificate `cert_sha256` names
    (as --coordinator-cert-sha256 gives it) or else this machine's CAs."""
    from shoal.client.http import CoordinatorClient
    from shoal.client.tls import CertificatePin

    pin = CertificatePin.parse(cert_sha256) if cert_sha256 else None
    return CoordinatorClient(url, account, pin=pin)


def _print(data: list, as_json: bool, table: Table) -> None:
    if as_json:
        typer.echo(json.dumps([d.model_dump(mode="json") for d in data], indent=1))
    else:
        Console().print(table)


@key_app.command("new")
def key_new(path: Path = typer.Argument(..., help="Where to write the key (mode 600).")) -> None:
    """Create a key file and print its address."""
    from shoal.errors import ControlError
    from shoal.client.identity import new_key

    try:
        account = new_key(str(path))
    except FileExistsError:
        raise ControlError(f"{path} exists; a key is never overwritten") from None
    typer.echo(account.address)


def submit_command(
    job: Path = typer.Argument(..., help="A job file (TOML), or your own script (.py): it is "
                               "bundled with the modules it imports and sent first."),
    args: Optional[list[str]] = typer.Argument(None, help="The script's arguments (after --)."),
    workers: int = typer.Option(..., "--workers", help="Devices wanted."),
    max_price: int = typer.Option(..., "--max-price", min=1,
                                  help="Most wei per second per device."),
    budget: int = typer.Option(..., "--budget", min=1, help="Wei escrowed for the job."),
    min_workers: int = typer.Option(1, "--min-workers", help="Fewest devices to run with."),
    priority: int = typer.Option(0, "--priority", help="Higher may preempt lower spot leases; "
                                 "above 0 up to the ceiling an operator granted you."),
    spot_only: bool = typer.Option(False, "--spot-only", help="Never lease on-demand devices."),
    region: list[str] = typer.Option([], "--region", help="Allowed region (repeatable)."),
    chain_job: int = typer.Option(None, "--chain-job", help="Your job on the settlement "
                                  "contract whose escrow backs --budget (if the coordinator "
                                  "settles on a chain)."),
    requirements: Optional[Path] = typer.Option(None, "--requirements", "-r", help="Script: "
                                                "its pinned requirements (NAME==VERSION "
                                                "lines; torch is the provider's)."),
    include: list[Path] = typer.Option([], "--include", help="Script: another file or "
                                       "directory beside it to carry (repeatable)."),
    data: Optional[str] = typer.Option(None, "--data", help="Script: the data's URL, as its "
                                       "workers read it (recorded in the bundle)."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Script: the steps its "
                                        "run.batches loop runs (the job ends there)."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", min=1, help="Script: "
                                               "the global batch its run.batches takes."),
    env: list[str] = typer.Option([], "--env", metavar="NAME=VALUE", help="Script: a "
                                  "variable its workers get, e.g. the data store's endpoint "
                                  "(in the job file, which anyone may read; repeatable)."),
    secret_env: list[str] = typer.Option([], "--secret-env", metavar="NAME", help="A "
                                         "bundled job's secret variable (the data's "
                                         "credentials), its value taken from your "
                                         "environment: kept out of the job file and sent "
                                         "only to running leases' providers (repeatable)."),
    url: str = URL, cert_sha256: str = CERT_SHA256, key: Path = KEY,
) -> None:
    """Submit a job with its budget and price ceiling; prints the job id.

    A script is the job `shoal run SCRIPT -- ARGS` would run, on leased devices: bundled
    (`shoal bundle`), sent, and named by its SHA-256 in the job, which providers run in
    its own environment and a sandbox.
    """
    from pydantic import ValidationError

    from shoal.client.http import CoordinatorRefused
    from shoal.errors import ControlError
    from shoal.spec.coordinator import JobSubmission, Registration

    if not job.is_file():
        raise ControlError(f"{job} not found: give a job file (.toml) or a script (.py)")
    script = job.suffix == ".py"
    if not script:
        given = [flag for flag, value in (("--requirements", requirements), ("--data", data),
                                           ("--steps", steps), ("--global-batch", global_batch),
                                           ("--include", include), ("--env", env),
                                           ("script arguments", args)) if value]
        if given:
            raise ControlError(f"{', '.join(given)}: for a script (.py); a job file says "
                               "all of it itself")
    with _client(url, key, cert_sha256) as client:
        try:
            client.register(Registration(role="submitter", name=job.stem[:64] or "submitter"))
        except CoordinatorRefused as refused:
            if refused.status != 409:
                raise
        if script:
            job_file = _send_bundle(client, job, list(args or []), requirements, include, data,
                                    steps, global_batch, env)
        else:
            job_file = job.read_text()
        try:
            submission = JobSubmission(
                name=job.stem[:64], job_file=job_file, workers=workers,
                min_workers=min_workers, max_price_wei_per_s=max_price, budget_wei=budget,
                priority=priority, regions=frozenset(region), chain_job=chain_job,
                tenancies=frozenset({"spot"}) if spot_only else frozenset({"spot", "on_demand"}),
                secret_env=_from_environment(secret_env))
        except ValidationError as error:
            raise ControlError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                         for e in error.errors())) from None
        view = client.submit(submission)
    typer.echo(view.job_id)


def _from_environment(names: list[str]) -> dict[str, str]:
    """The values of `names` in this process's environment (a secret is never typed on a
    command line, where `ps` and the shell's history show it)."""
    import os

    from shoal.errors import ControlError

    missing = [name for name in names if name not in os.environ]
    if missing:
        raise ControlError(f"--secret-env {', '.join(missing)}: not set in your environment "
                           "(export it first; its value is read from there)")
    return {name: os.environ[name] for name in names}


def _send_bundle(client, script: Path, args: list[str], requirements: Path | None,  # noqa: ANN001
                 include: list[Path], data: str | None, steps: int | None,
                 global_batch: int | None, env: list[str]) -> str:
    """Bundle `script`, send the bundle, and write the job file that names it."""
    from shoal.bundle import pack_bundle
    from shoal.errors import ControlError
    from shoal.spec.jobfile import parse_job

    if steps is None or global_batch is None:
        raise ControlError("a script's job needs --steps and --global-batch: the numbers "
                           "its run.batches loop takes (the job ends at those steps, and "
                           "the market plans for that batch)")
    variables = {}
    for item in env:
        name, equals, value = item.partition("=")
        if not equals:
            raise ControlError(f"--env {item!r}: give NAME=VALUE")
        variables[name] = value
    bundle = pack_bundle(script, requirements=requirements, include=tuple(include), data=data)
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in script.stem)[:64] or "job"
    values = {"name": name, "steps": steps, "global_batch": global_batch,
              "bundle": {"sha256": bundle.sha256, "args": args, "env": variables}}
    parse_job(values, "the job")  # refused here, with its reason, before anything is sent
    client.upload_bundle(bundle.sha256, bundle.archive)
    typer.echo(f"bundle {bundle.sha256} ({len(bundle.archive)} bytes, "
               f"{len(bundle.manifest.files)} files) sent", err=True)
    return _toml(values)


def _toml(values: dict) -> str:
    """The job file of a script's job (TOML of strings, numbers and one table deep)."""
    def value(v: object) -> str:
        if isinstance(v, str):
            return json.dumps(v)  # a TOML basic string is a JSON string
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return str(v)

    lines = [f"{k} = {value(v)}" for k, v in values.items() if not isinstance(v, dict)]
    for table, items in ((k, v) for k, v in values.items() if isinstance(v, dict)):
        lines += ["", f"[{table}]", *(f"{k} = {value(x)}" for k, x in items.items())]
    return "\n".join(lines) + "\n"


def model_command(
    job: str = typer.Argument(..., help="Your job's id."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the model "
                             "(safetensors: safetensors.torch.load_file, then "
                             "model.load_state_dict)."),
    url: str = URL, cert_sha256: str = CERT_SHA256, key: Path = KEY,
) -> None:
    """Download your job's model: the parameters of its newest carried checkpoint."""
    import hashlib

    from safetensors.torch import save_file

    from shoal.errors import ControlError
    from shoal.train.state_file import decode

    with _client(url, key, cert_sha256) as client:
        view = client.carried_checkpoint(job)
        if view is None:
            raise ControlError(f"job {job} has no carried checkpoint yet (its workers write "
                               "one every [checkpoint] interval_steps; try again later)")
        data = client.checkpoint_file(job, view.step)
    if hashlib.sha256(data).hexdigest() != view.sha256:
        raise ControlError(f"the checkpoint of step {view.step} changed while it was fetched "
                           "(a newer one was carried): run the command again")
    state = decode(data, limit=len(data))
    tensors = {name: tensor.contiguous() for name, tensor in state["model"].items()}
    save_file(tensors, str(out), metadata={"job": job, "step": str(view.step),
                                           "checkpoint_sha256": view.sha256})
    typer.echo(f"{out}: the model of job {job} at step {view.step} ({len(tensors)} tensors, "
               f"{sum(t.numel() for t in tensors.values()):,} parameters)")


def jobs_command(url: str = URL, cert_sha256: str = CERT_SHA256,
                 as_json: bool = AS_JSON) -> None:
    """List jobs: status, devices held, spend against budget."""
    with _client(url, None, cert_sha256) as client:
        jobs = client.jobs()
    table = Table("job", "status", "code", "workers", "held", "spent / budget (wei)", "devices")
    now = time.time()
    for job in jobs:
        held = [lease for lease in job.leases if lease.ends_at_s is None or lease.ends_at_s > now]
        code = f"bundle {job.bundle_sha256[:12]}" if job.bundle_sha256 else "built-in GPT"
        table.add_row(job.job_id, job.status.value, code, str(job.workers), str(len(held)),
                      f"{job.spent_wei} / {job.budget_wei}",
                      ", ".join(f"{lease.offer_id} ({lease.device_kind}, {lease.region}, "
                                f"{lease.price_wei_per_s} wei/s)" for lease in held))
    _print(jobs, as_json, table)


def providers_command(url: str = URL, cert_sha256: str = CERT_SHA256,
                      as_json: bool = AS_JSON) -> None:
    """List providers, their agents and their offers."""
    with _client(url, None, cert_sha256) as client:
        providers = client.providers()
    table = Table("provider", "name", "agents online", "offers (kind, speed, price)")
    for p in providers:
        table.add_row(p.address, p.name, f"{sum(a.online for a in p.agents)}/{len(p.agents)}",
                      ", ".join(f"{o.offer_id} ({o.device_kind}, {o.speed_samples_per_s:g}/s, "
                                f"{o.price_wei_per_s} wei/s{', withdrawn' if o.withdrawn else ''})"
                                for o in p.offers))
    _print(providers, as_json, table)


def events_command(
    job: str = typer.Argument(None, help="Only this job's events."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events."),
    url: str = URL, cert_sha256: str = CERT_SHA256, as_json: bool = AS_JSON,
) -> None:
    """Print the audit log: every state change, who made it, when."""
    after = 0
    with _client(url, None, cert_sha256) as client:
        while True:
            for event in client.every_event(job=job, after=after):
                after = event.seq
                if as_json:
                    typer.echo(event.model_dump_json())
                else:
                    stamp = time.strftime("%H:%M:%S", time.localtime(event.at_s))
                    detail = " ".join(f"{k}={v}" for k, v in event.detail.items())
                    typer.echo(f"{event.seq:>6} {stamp} {event.kind:<16} {event.job_id or '-'} "
                               f"by {event.actor[:10]} {detail}")
            if not follow:
                return
            time.sleep(1.0)


def top_up_command(job: str = typer.Argument(...), amount: int = typer.Argument(..., help="wei"),
                   url: str = URL, cert_sha256: str = CERT_SHA256, key: Path = KEY) -> None:
    """Add escrow to your job; a job paused for want of it resumes."""
    with _client(url, key, cert_sha256) as client:
        view = client.top_up(job, amount)
    typer.echo(f"{view.job_id}: budget {view.budget_wei} wei, remaining {view.remaining_wei} wei")


def cancel_command(job: str = typer.Argument(...), url: str = URL,
                   cert_sha256: str = CERT_SHA256, key: Path = KEY) -> None:
    """Cancel your job: every lease ends now."""
    with _client(url, key, cert_sha256) as client:
        view = client.job_action(job, "cancel")
    typer.echo(f"{view.job_id}: {view.status.value}, spent {view.spent_wei} wei")


def grant_command(address: str = typer.Argument(..., help="The key's 0x address."),
                  role: str = typer.Argument(..., help="verifier, operator, or submitter "
                                             "(with --max-priority)."),
                  name: str = typer.Option("granted", "--name", help="Its name in the audit log."),
                  max_priority: int | None = typer.Option(
                      None, "--max-priority", help="The highest priority the key's jobs may "
                      "take (above 0 they preempt others' spot devices)."),
                  url: str = URL, cert_sha256: str = CERT_SHA256, key: Path = KEY) -> None:
    """Give a key a role, or a submitter a priority ceiling (you must be an operator)."""
    from shoal.spec.coordinator import Grant, Participant, Role

    with _client(url, key, cert_sha256) as client:
        view = client._post("/v1/grants", Grant(address=address, role=Role(role), name=name,
                                                max_priority=max_priority), Participant)
    typer.echo(f"{view.address}: {view.role.value} ({view.name}), max priority "
               f"{view.max_priority}")
