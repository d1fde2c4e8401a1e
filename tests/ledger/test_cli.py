"""`shoal chain ...` as a user runs it: the embedded demo and a real node."""

from __future__ import annotations

import json
import subprocess

import pytest

from shoal.ledger import Chain, Ledger
from tests.conftest import shoal_command
from tests.ledger.conftest import Actors


def _run(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(shoal_command(*args), capture_output=True, text=True, timeout=timeout_s)


def test_demo_runs_a_job_and_shows_it():
    result = _run("chain", "demo", "--providers", "3", "--epochs", "2", "--json")
    assert result.returncode == 0, result.stderr
    demo = json.loads(result.stdout)
    status, anchors, balances, events = (demo[k] for k in ("status", "anchors", "balances", "events"))
    assert status["job"]["state"] == "settled" and len(anchors) == 2
    states = sorted(lease["state"] for lease in status["leases"])
    assert states == ["paid", "paid", "slashed"]
    slashed = next(x for x in status["leases"] if x["state"] == "slashed")
    assert slashed["paid_wei"] == 0
    # Every stake, less the cheat's collateral (the demo's min_stake).
    assert balances["contract_wei"] == 3 * 10**17 - 10**16
    assert [e["name"] for e in events].count("Anchored") == 2


def test_inspecting_needs_a_node():
    result = _run("chain", "status", "--job", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "shoal chain demo" in result.stderr


@pytest.mark.slow
@pytest.mark.parallel_ok  # commands against a node, nothing timed
def test_inspect_a_contract_on_a_real_node(hardhat_url):
    deployed = _run("chain", "deploy", "--rpc", hardhat_url, "--fee-bps", "100")
    assert deployed.returncode == 0, deployed.stderr
    address = deployed.stdout.strip()
    chain = Chain.rpc(hardhat_url)
    a = Actors.of(chain)
    ledger = Ledger.at(chain, address)
    job = ledger.create_job(a.submitters[0], 10**9, 10**15).returned
    ledger.anchor(a.owner, job, 0, b"\x0a" * 32)  # the deployer is the operator by default
    base = ("--rpc", hardhat_url, "--contract", address, "--json")
    status = json.loads(_run("chain", "status", "--job", str(job), *base).stdout)
    assert status["job"]["escrow_wei"] == 10**15 and status["job"]["epochs"] == 1
    anchors = json.loads(_run("chain", "anchors", "--job", str(job), *base).stdout)
    assert anchors == [{"job": job, "epoch": 0, "root": "0x" + "0a" * 32}]
    events = json.loads(_run("chain", "events", "--job", str(job), *base).stdout)
    assert [e["name"] for e in events] == ["JobFunded", "Anchored"]
    balances = json.loads(_run("chain", "balances", a.submitters[0].address, *base).stdout)
    assert balances["contract_wei"] == 10**15


@pytest.mark.slow
@pytest.mark.parallel_ok  # commands against a node, nothing timed
def test_a_submitter_and_a_provider_send_their_own_transactions(hardhat_url, tmp_path):
    address = _run("chain", "deploy", "--rpc", hardhat_url).stdout.strip()
    accounts = Chain.rpc(hardhat_url).dev_accounts()
    keys = {}
    for name, account in (("alice", accounts[3]), ("provider", accounts[5])):
        keys[name] = tmp_path / f"{name}.key"
        keys[name].write_text("0x" + bytes(account.key).hex())
    base = ("--rpc", hardhat_url, "--contract", address)
    made = _run("chain", "create-job", "--deposit", "5000", "--max-price", "7",
                "--key", str(keys["alice"]), *base)
    assert made.returncode == 0, made.stderr
    job = int(made.stdout)
    assert _run("chain", "fund", "--job", str(job), "--amount", "100", "--key", str(keys["alice"]),
                *base).returncode == 0
    staked = _run("chain", "stake", "--amount", str(10**16), "--key", str(keys["provider"]), *base)
    assert staked.returncode == 0, staked.stderr
    ledger = Ledger.at(Chain.rpc(hardhat_url), address)
    escrow = ledger.job(job)
    assert (escrow.submitter, escrow.escrow_wei, escrow.max_price_wei_per_s) == (
        accounts[3].address, 5100, 7)
    assert ledger.stake_of(accounts[5].address).active_wei == 10**16
    wrong = _run("chain", "stake", "--amount", "1", "--key", str(tmp_path / "none.key"), *base)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr


@pytest.mark.slow
def test_work_records_anchored_then_verified_against_the_chain(hardhat_url, tmp_path):
    """The operator anchors each proof epoch's root; a verifier checks records against
    it, and a record edited after its epoch was anchored no longer passes."""
    from tests.verify.roles.conftest import run_proven_job

    proven = run_proven_job(tmp_path / "job", workers=2, steps=6, epoch_steps=3)
    job_file = str(tmp_path / "job" / "job.toml")
    address = _run("chain", "deploy", "--rpc", hardhat_url).stdout.strip()
    chain = Chain.rpc(hardhat_url)
    a = Actors.of(chain)
    key = tmp_path / "operator.key"
    key.write_text("0x" + bytes(a.owner.key).hex())  # the deployer is the operator by default
    job = Ledger.at(chain, address).create_job(a.submitters[0], 10**9, 10**15).returned
    base = ("--rpc", hardhat_url, "--contract", address)
    anchored = _run("chain", "anchor-records", job_file, "--job", str(job), "--key", str(key), *base)
    assert anchored.returncode == 0, anchored.stderr
    assert anchored.stdout.count("anchored") == 2
    again = _run("chain", "anchor-records", job_file, "--job", str(job), "--key", str(key), *base)
    assert "nothing new" in again.stdout
    verify = ("verify", job_file, "--all", "--json", "--chain-job", str(job), *base)
    clean = _run(*verify)
    assert clean.returncode == 0, clean.stderr[-2000:]
    # Rewrite w1's record of step 4 (claims a different norm) after the anchor.
    path = proven.store.layout.records("w1")
    lines = path.read_text().splitlines()
    record = json.loads(lines[4])
    record["contribution_norm"] += 1.0
    lines[4] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    tampered = _run(*verify)
    assert tampered.returncode == 1
    assert json.loads(tampered.stdout)["guilty"] == {"w1": "bad_proof"}
