"""`shoal dispute`, run as a challenger runs it: its own process, its key file, a
coordinator on loopback and the contract on a Hardhat node (the embedded chain lives
in one process only). Against an epoch with a cheating step it bonds a dispute the
referee upholds, and the bond comes back with the slash's reward; against an honest
epoch it replays everything, finds nothing and sends no transaction at all."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from shoal.ledger import Chain, LedgerError
from shoal.spec.coordinator import Grant, Role
from shoal.spec.ledger import DisputeState
from tests.conftest import shoal_command
from tests.coordinator.e2e import key_file
from tests.coordinator.test_disputes import CHEAT_STEP, Disputed
from tests.ledger.conftest import hardhat_url  # noqa: F401  (a Hardhat node on loopback)

BPS = 10_000


@pytest.fixture
def node(hardhat_url):  # noqa: F811
    """The Hardhat node's chain: the CLI's process reaches it over JSON-RPC."""
    return Chain.rpc(hardhat_url)


def run_dispute(s: Disputed, tmp_path: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """`shoal dispute` on epoch 0 of s.worker, by mallory (the coordinator's verifier, so
    that she may ask for the files), while agent a answers what it is asked; returns the
    exit status, stdout and stderr."""
    s.served.client(s.operator).request("POST", "/v1/grants", Grant(
        address=s.mallory.address, role=Role.verifier, name="mallory"))
    key = key_file(tmp_path / "mallory.key", s.mallory)
    workdir = tmp_path / "challenger"  # the CLI keeps the fetched files under ./runs
    workdir.mkdir()
    out, err = tmp_path / "dispute.out", tmp_path / "dispute.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        cli = subprocess.Popen(shoal_command(
            "dispute", "--coordinator", s.served.url, "--job", s.job_id, "--worker", s.worker,
            "--epoch", "0", "--key", str(key), "--rpc", s.ledger.chain.url,
            "--contract", s.ledger.address, "--answer-wait-s", "30", "--ruling-wait-s", "60",
            "--json"), stdout=stdout, stderr=stderr, cwd=workdir, env=env)
    try:
        s.answer_until(lambda: cli.poll() is not None, timeout_s=180.0)
    finally:
        cli.kill()
        cli.wait()
    return cli.returncode, out.read_text(), err.read_text()


@pytest.mark.slow
def test_dispute_of_a_cheating_epoch_is_upheld_and_the_cheat_slashed(node, tmp_path, cli_env):
    s = Disputed(tmp_path, chain=node)
    try:
        alice = s.ledger.job(s.chain_job).submitter
        (honest,) = {held.provider for held in s.a.job(s.job_id).leases} - {s.p1.address}
        stake, honest_stake = (s.ledger.stake_of(p).active_wei for p in (s.p1.address, honest))
        credits = {a: s.ledger.credit_of(a) for a in (s.mallory.address, alice)}
        wallet = s.ledger.chain.balance(s.mallory.address)

        code, out, err = run_dispute(s, tmp_path, cli_env)

        assert code == 0, err[-3000:]
        found = json.loads(out)
        assert found["replayed"] == 5 and found["rejected_steps"] == [CHEAT_STEP]
        view = found["dispute"]
        assert (view["ruling"], view["step"], view["chain_state"]) == (
            "upheld", CHEAT_STEP, "upheld"), view["why"]
        assert view["worker"] == s.worker and view["provider"] == s.p1.address
        # On chain: mallory's bond (the contract's minimum) opened it, and it was upheld.
        bond = s.ledger.config().min_bond_wei
        dispute = s.ledger.dispute(view["dispute"])
        assert dispute.state is DisputeState.upheld
        assert (dispute.challenger, dispute.bond_wei) == (s.mallory.address, bond)
        # The cheat lost its lease's collateral; the challenger has its bond back and the
        # whistleblower's share of that; the rest goes to the submitter.
        assert s.ledger.lease(s.chain_job, s.p1.address).slashed
        taken = stake - s.ledger.stake_of(s.p1.address).active_wei
        assert taken > 0
        reward = taken * s.ledger.config().whistleblower_bps // BPS
        assert s.ledger.credit_of(s.mallory.address) - credits[s.mallory.address] == bond + reward
        assert s.ledger.credit_of(alice) - credits[alice] == taken - reward
        assert wallet - s.ledger.chain.balance(s.mallory.address) >= bond  # the bond (and gas) left
        # The honest provider on the same job is untouched.
        assert s.ledger.stake_of(honest).active_wei == honest_stake
        assert not s.ledger.lease(s.chain_job, honest).slashed
    finally:
        s.close()


@pytest.mark.slow
def test_dispute_of_an_honest_epoch_replays_it_all_and_spends_no_bond(node, tmp_path, cli_env):
    s = Disputed(tmp_path, cheat=frozenset(), chain=node)
    try:
        balance = s.ledger.chain.balance(s.mallory.address)

        code, out, err = run_dispute(s, tmp_path, cli_env)

        assert code == 0, err[-3000:]
        found = json.loads(out)
        assert found == {"replayed": 5, "rejected_steps": [], "dispute": None}
        # Not one transaction from the challenger: not even gas was spent.
        assert s.ledger.chain.balance(s.mallory.address) == balance
        assert s.ledger.credit_of(s.mallory.address) == 0
        with pytest.raises(LedgerError):  # no dispute was opened on this contract
            s.ledger.dispute(1)
        lease = s.ledger.lease(s.chain_job, s.p1.address)
        assert not lease.slashed and not lease.disputed
        assert s.a.disputes(s.job_id) == []
    finally:
        s.close()
