"""`shoal verify JOB.toml`: audit a job's work records by replay and print
the verdicts (exit status 1 when a worker is found cheating)."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Optional

import typer

from shoal import ShoalError
from shoal.cli.market_cmd import CERT_SHA256, coordinator_client
from shoal.proof.epochs import epoch_of
from shoal.spec import hyper_digest, load_job


def verify_command(
    job_file: Optional[Path] = typer.Argument(None, help="The job file the run used (its [proof] "
                                              "section); not with --coordinator."),
    proof_dir: Optional[Path] = typer.Option(None, "--proof-dir", help="Override proof.dir."),
    rate: Optional[float] = typer.Option(None, "--rate", min=0.0, max=1.0,
                                         help="Share of each epoch's records to replay "
                                              "(default: the job's proof.audit_rate)."),
    every: bool = typer.Option(False, "--all", help="Replay every record (a full audit)."),
    epochs: list[int] = typer.Option([], "--epoch", help="Audit only this proof epoch (repeatable)."),
    tolerance: Optional[float] = typer.Option(None, "--tolerance", min=0.0,
                                              help="Override proof.tolerance."),
    salt: Optional[str] = typer.Option(None, "--salt", help="Hex salt of the audit beacon "
                                                              "(default: fresh, printed)."),
    key: Optional[Path] = typer.Option(None, "--key", help="Sign each verdict with this key and "
                                                            "log it under the proof directory."),
    profile: bool = typer.Option(False, "--profile", help="Measure honest replay non-determinism "
                                                          "across thread counts and suggest a "
                                                          "tolerance, instead of auditing."),
    follow: bool = typer.Option(False, "--follow", help="Keep auditing each epoch as the job "
                                                        "completes it, until its last step."),
    interval_s: float = typer.Option(5.0, "--interval-s", min=0.1,
                                     help="With --follow: how often to look for new epochs."),
    chain_job: Optional[int] = typer.Option(None, "--chain-job", help="Check records against "
                                                                    "this job's anchored roots."),
    rpc: Optional[str] = typer.Option(None, "--rpc", envvar="SHOAL_CHAIN_RPC",
                                      help="JSON-RPC URL of the chain (with --chain-job)."),
    contract: Optional[str] = typer.Option(None, "--contract", envvar="SHOAL_LEDGER_CONTRACT",
                                           help="Market contract address (with --chain-job)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="The run's directory (its "
                                           "epochs.jsonl names who held each rank), so that a "
                                           "worker's share of a step it filed no record for "
                                           "is judged too."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", envvar="SHOAL_COORDINATOR_URL",
                                              help="Audit a market job through this coordinator "
                                                   "(URL), filing signed verdicts there."),
    cert_sha256: Optional[str] = CERT_SHA256,
    job_id: Optional[str] = typer.Option(None, "--job", help="The market job's id (with "
                                                             "--coordinator)."),
    answer_wait_s: float = typer.Option(60.0, "--answer-wait-s", min=0.1,
                                        help="With --coordinator: how long agents get to "
                                             "answer a challenge."),
    recheck: bool = typer.Option(False, "--recheck", help="With --coordinator: be a "
                                 "whistleblower, re-auditing the records other verifiers "
                                 "judged; a wrong `valid` costs its verifier stake."),
) -> None:
    """Replay sampled work records of a job and judge each one."""
    try:
        salt_bytes = bytes.fromhex(salt) if salt else secrets.token_bytes(16)
    except ValueError:
        raise ShoalError(f"--salt {salt!r} is not hex") from None
    if coordinator is not None:
        if job_file is not None or job_id is None or key is None:
            raise ShoalError("--coordinator audits a market job: give --job ID and --key PATH "
                             "(a verifier's key), and no job file")
        _verify_remote(coordinator, job_id, key, salt_bytes, rate, every, follow, interval_s,
                       answer_wait_s, tolerance, as_json, recheck, cert_sha256)
        return
    if job_file is None:
        raise ShoalError("give the job file the run used, or --coordinator URL --job ID")
    job = load_job(job_file)
    directory = str(proof_dir) if proof_dir else job.proof_dir
    if follow:
        _wait_for_records(directory, interval_s)
    if not Path(directory, "records").is_dir():
        raise ShoalError(f"no work records under {directory}: run the job with [proof] "
                         "enabled = true (or pass --proof-dir)")
    from shoal.verify.roles.verdicts import VerdictLog, sign_verdict
    from shoal.verify.roles.verifier import Verifier
    from shoal.models.gpt_replay import gpt_replayer
    from shoal.verify.audit.record import Auditor, profile_tolerance
    from shoal.verify.proof_store import ProofStore

    store, replayer = ProofStore(directory), gpt_replayer(job)
    records = store.records()
    if profile:
        figures = profile_tolerance(replayer, store, records[: 64])
        typer.echo(json.dumps(figures) if as_json else
                   f"honest replay distance up to {figures['max_honest_distance']:.2e} over "
                   f"{figures['records']} records at {figures['thread_counts']} threads; "
                   f"suggested proof.tolerance = {figures['suggested_tolerance']:.1e}")
        return
    account = None
    if key is not None:
        from shoal.client.identity import load_key
        account = load_key(str(key))
    auditor = Auditor(store, replayer, hyper_sha256=hyper_digest(job.hyperparameters()),
                      tolerance=tolerance if tolerance is not None else job.proof.tolerance,
                      verifier=account.address if account else "")
    verifier = Verifier(auditor, job.proof, salt=salt_bytes, total_steps=job.steps,
                        roots=_anchored_roots(chain_job, rpc, contract),
                        leaves=lambda epoch: (store.load_anchor(epoch) or (None, None))[1],
                        members=_members(run_dir), sources=_state_sources(run_dir))
    log = VerdictLog(directory)
    results, done, started = [], set(), time.perf_counter()
    last_epoch = epoch_of(job.steps - 1, job.proof.epoch_steps)
    while True:
        grouped: dict[int, list] = {}
        for record in records:
            grouped.setdefault(epoch_of(record.step, job.proof.epoch_steps), []).append(record)
        todo = [e for e in verifier.complete_epochs(records)
                if (not epochs or e in epochs) and e not in done]
        for epoch in todo:
            result = verifier.audit_epoch(epoch, grouped[epoch], rate=rate, every=every)
            if account is not None:
                for verdict in result.verdicts:
                    log.append(sign_verdict(verdict, account))
            results.append(result)
            done.add(epoch)
            if follow and not as_json:
                typer.echo(f"epoch {epoch}: {len(result.verdicts)} audits, guilty: "
                           f"{', '.join(sorted(result.guilty)) or 'none'}")
        if not follow or last_epoch in done or (epochs and set(epochs) <= done):
            break
        time.sleep(interval_s)
        records = store.records()
    if not results:
        raise ShoalError(f"no complete proof epoch in {directory} to audit yet")
    _print(results, salt_bytes, time.perf_counter() - started, as_json)
    if any(r.guilty for r in results):
        raise typer.Exit(1)


def _verify_remote(url: str, job_id: str, key: Path, salt: bytes, rate: float | None, every: bool,
                   follow: bool, interval_s: float, answer_wait_s: float,
                   tolerance: float | None, as_json: bool, recheck: bool = False,
                   cert_sha256: str | None = None) -> None:
    """Audit a market job through its coordinator: challenges, replays, filed verdicts."""
    from shoal.client.identity import load_key
    from shoal.verify.roles.remote import RemoteAudits
    from shoal.spec.coordinator import ENDED

    account = load_key(str(key))
    results, started = [], time.perf_counter()
    with coordinator_client(url, account, cert_sha256) as client:
        job, auditor = remote_auditor(client, job_id, account.address, "verifier", tolerance)
        audits = RemoteAudits(client, job_id, job, auditor, account, salt=salt, rate=rate,
                              every=every, answer_wait_s=answer_wait_s, recheck=recheck)
        last_epoch = epoch_of(job.steps - 1, job.proof.epoch_steps)
        while True:
            for epoch in audits.pending_epochs():
                result = audits.audit(epoch)
                results.append(result)
                if follow and not as_json:
                    typer.echo(f"epoch {epoch}: {len(result.verdicts)} audits filed, guilty: "
                               f"{', '.join(sorted(result.guilty)) or 'none'}")
            ended = client.job(job_id).status in ENDED
            if not follow or (last_epoch in audits.done and not recheck) or \
                    (ended and not audits.pending_epochs()):
                break
            time.sleep(interval_s)
    if not results and not recheck:
        raise ShoalError(f"job {job_id} has no rooted proof epoch to audit yet (try --follow)")
    _print(results, salt, time.perf_counter() - started, as_json)
    if any(r.guilty for r in results):
        raise typer.Exit(1)


def remote_auditor(client, job_id: str, address: str, role: str,  # noqa: ANN001 - a client
                   tolerance: float | None = None):  # noqa: ANN201 - (JobSpec, Auditor)
    """The market job's spec and an auditor replaying it, its files fetched into
    runs/ROLE/ADDRESS/JOB (a verifier's, a challenger's)."""
    import tomllib

    from shoal.models.gpt_replay import gpt_replayer
    from shoal.spec.jobfile import parse_job
    from shoal.verify.audit.record import Auditor
    from shoal.verify.proof_store import ProofStore

    job = parse_job(tomllib.loads(client.job_file(job_id)), source=f"job {job_id}")
    if not job.proof.enabled:
        raise ShoalError(f"job {job_id} keeps no work records ([proof] enabled = false)")
    store = ProofStore(Path("runs") / role / address / job_id)
    auditor = Auditor(store, gpt_replayer(job), hyper_sha256=hyper_digest(job.hyperparameters()),
                      tolerance=tolerance if tolerance is not None else job.proof.tolerance,
                      verifier=address)
    return job, auditor


def _anchored_roots(chain_job: int | None, rpc: str | None, contract: str | None):  # noqa: ANN202
    """epoch -> the root anchored on chain (None when not anchored yet): records that
    changed after their epoch was anchored then fail their Merkle proofs."""
    if chain_job is None:
        return lambda epoch: None
    from shoal.cli.chain_cmd import _ledger

    ledger, known = _ledger(rpc, contract, 10.0), {}

    def root(epoch: int) -> bytes | None:
        if epoch not in known:  # an anchor never changes once written: read it once
            anchors = ledger.anchors(chain_job)
            known.update({a.epoch: bytes.fromhex(a.root[2:]) for a in anchors})
        return known.get(epoch)

    return root


def _members(run_dir: Path | None):  # noqa: ANN202 - the verifier's `Members`
    """The membership epochs the run's host published, by number (none without a run)."""
    if run_dir is None:
        return lambda epoch: None
    if not (run_dir / "epochs.jsonl").is_file():
        raise ShoalError(f"no epochs.jsonl in {run_dir}: give the --run-dir the job ran with")
    from shoal.coordinator.proofs.published_epochs import PublishedEpochs

    published = PublishedEpochs(lambda _: run_dir)
    return lambda epoch: published.members("", epoch)


def _state_sources(run_dir: Path | None):  # noqa: ANN202 - the verifier's `StateSources`
    """The state source each resync epoch of the run named (none without a run)."""
    if run_dir is None:
        return lambda epoch: None
    from shoal.coordinator.proofs.published_epochs import PublishedEpochs

    published = PublishedEpochs(lambda _: run_dir)
    return lambda epoch: published.state_source("", epoch)


def _wait_for_records(directory: str, interval_s: float) -> None:
    while not Path(directory, "records").is_dir():
        time.sleep(interval_s)


def _print(results: list, salt: bytes, wall_s: float, as_json: bool) -> None:
    guilty = {w: v[0].kind.value for r in results for w, v in r.guilty.items()}
    audited = sum(len(r.verdicts) for r in results)
    unnamed = sum(len(r.unnamed) for r in results)
    if as_json:
        typer.echo(json.dumps({
            "salt": salt.hex(), "epochs": [r.epoch for r in results], "audited": audited,
            "records": sum(r.records for r in results), "guilty": guilty,
            "unjudged_unrecorded": unnamed, "wall_s": round(wall_s, 3),
            "verdicts": [v.model_dump(mode="json") for r in results for v in r.verdicts]}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"audit (beacon salt {salt.hex()})")
    for column in ("epoch", "root", "records", "audited", "guilty"):
        table.add_column(column)
    for r in results:
        names = ", ".join(f"{w} ({v[0].kind.value}, step {v[0].step})" for w, v in r.guilty.items())
        table.add_row(str(r.epoch), r.root.hex()[:12] + ("" if r.anchored else " (local)"),
                      str(r.records), str(len(r.verdicts)), names or "none")
    Console().print(table)
    typer.echo(f"{audited} audits in {wall_s:.1f} s; "
               + (f"cheating: {', '.join(sorted(guilty))}" if guilty else "no cheating found"))
    if unnamed:
        typer.echo(f"{unnamed} share(s) of voted steps have no work record and were not judged: "
                   "pass --run-dir (the run's epochs.jsonl names their workers)", err=True)
