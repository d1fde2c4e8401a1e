"""Proof of learning as a service of the coordinator, end to end, as separate
processes on a real JSON-RPC chain: three agents (one of them cheating: its
worker sends sign-flipped gradients), a verifier following the job, and the
coordinator as the contract's operator and referee. Every proof epoch is
rooted and anchored; the verifier's challenges reach the agents and are
answered; the cheat is caught, its verdict upheld by one replay, its
provider slashed on chain, dropped from the job and replaced; the job
finishes; the honest providers are paid for what the store metered and the
cheat for nothing."""

from __future__ import annotations

import json

import pytest
from eth_account import Account

from shoal.spec.coordinator import Grant, JobStatus, JobSubmission, Registration, Role
from tests.conftest import free_port
from tests.coordinator.e2e import Stack, job_toml, key_file, submitter, wait_healthy
from tests.coordinator.test_agents import wait_for
from tests.ledger.conftest import hardhat_url  # noqa: F401  (a Hardhat node on loopback)

PRICE = 1_000_000
STEPS = 600
# Every epoch's files are kept to the end (a fast job outruns the verifier's first replay):
# the coordinator's window is open long after the job.
PROOF = "[proof]\nenabled = true\nepoch_steps = 50\naudit_rate = 0.02\nkeep_s = 900\n"


# Every-step sync with a sign-flipping cheat; DiLoCo with a cheat whose inner steps are
# all honest and whose pseudo-gradients are scaled x10 (the only value that reaches the
# model there), audited from each worker's own kept states through the same challenges.
SYNCS = {"every_step": ("", "sign_flip"),
         "diloco": ('[sync]\nmode = "diloco"\ninner_steps = 5\n', "outer_scale")}


@pytest.mark.slow
@pytest.mark.parametrize("sync", sorted(SYNCS))
def test_a_cheating_provider_is_caught_slashed_replaced_and_unpaid(hardhat_url, tmp_path,  # noqa: F811
                                                                    cli_env, sync):
    sync_toml, adversary = SYNCS[sync]
    from shoal.ledger import Chain, Ledger
    from shoal.spec.ledger import LedgerConfig

    chain = Chain.rpc(hardhat_url)
    owner, operator, referee, alice_account, vera, *rest = chain.dev_accounts()[:8]
    honest_a, cheat, honest_c = rest
    ledger = Ledger.deploy(chain, owner, operator.address, referee.address,
                           LedgerConfig(min_stake_wei=10**15))
    # The verifier stakes too: its verdicts are taken only while its stake covers them.
    for account in (*rest, vera):
        ledger.stake(account, 10**18)
    budget = 10**15
    chain_job = ledger.create_job(alice_account, 2 * PRICE, budget).returned
    admin = Account.create()  # the coordinator's operator role (grants the verifier)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Forced errors are served at the coordinator's default rate; revealed as soon as the
    # job ends (no window), so that this test can tell the plants from the cheat.
    stack = Stack(tmp_path, {**cli_env, "SHOAL_COORDINATOR_DATA_DIR": str(tmp_path / "coord"),
                             "SHOAL_COORDINATOR_FORCED_ERROR_WINDOW_S": "0"})
    try:
        coordinator = stack.coordinator(
            f"sqlite:///{tmp_path}/store.db", "127.0.0.1", port, operator=admin.address,
            chain=(hardhat_url, ledger.address, str(key_file(tmp_path / "operator.key", operator))),
            extra=("--referee-key", str(key_file(tmp_path / "referee.key", referee))))
        wait_healthy(url, coordinator)
        # The cheat asks least, so it is leased first; c is dearest: the replacement.
        stack.agent("b", url, PRICE, slowdown=4.0, account=cheat, extra=("--adversary", adversary))
        stack.agent("a", url, PRICE + 1, slowdown=4.0, account=honest_a)
        stack.agent("c", url, PRICE + 2, slowdown=4.0, account=honest_c)
        alice = submitter(url, tmp_path, alice_account)
        wait_for(lambda: sum(len(p.offers) for p in alice.providers()), lambda n: n == 3, 120,
                 stack, "three agents offering")
        alice.register(Registration(role="submitter", name="alice"))
        submitter(url, tmp_path, admin).request("POST", "/v1/grants", Grant(
            address=vera.address, role=Role.verifier, name="vera"))
        job = alice.submit(JobSubmission(
            name="e2e", job_file=job_toml(tmp_path / "ckpt", STEPS) + PROOF + sync_toml, workers=2,
            min_workers=2, max_price_wei_per_s=2 * PRICE, budget_wei=budget, chain_job=chain_job))
        verifier = stack.start("verifier", "verify", "--coordinator", url, "--job", job.job_id,
                               "--key", str(key_file(tmp_path / "vera.key", vera)), "--follow",
                               "--interval-s", "1", "--answer-wait-s", "30", "--json")

        done = wait_for(lambda: alice.job(job.job_id), lambda j: j.status in (
            JobStatus.finished, JobStatus.failed), 600, stack, "job end")
        assert done.status is JobStatus.finished, stack.logs()
        assert verifier.wait(timeout=300) == 1, stack.logs()  # it found cheating
        found = json.loads((tmp_path / "verifier.log").read_text().strip().splitlines()[-1])
        reveal = wait_for(lambda: [e for e in alice.every_event(job=job.job_id)
                                   if e.kind == "forced_errors_revealed"], bool, 60, stack,
                          "the forced errors revealed")[0]
        planted = {(worker, step) for _, worker, step, state in reveal.detail["plants"]
                   if state == "ready"}
        # Guilty verdicts on real records name only the cheat's workers; the verifier cannot
        # tell a plant from a cheat, so the plants it caught (on anyone's records) are apart.
        guilty = [v.verdict for v in alice.verdicts(job.job_id) if v.verdict.guilty]
        assert {v.worker.split("-l")[0] for v in guilty
                if (v.worker, v.step) not in planted} == {"b"}
        assert {w.split("-l")[0] for w in found["guilty"]} <= {"b"} | {
            w.split("-l")[0] for w, _ in planted}
        assert not [e for e in alice.every_event(job=job.job_id)
                    if e.kind == "forced_error_missed"]  # the verifier replays: it misses none

        events = list(alice.every_event(job=job.job_id))
        (slashed,) = [e for e in events if e.kind == "worker_slashed"]  # once, on chain
        assert slashed.detail["provider"] == cheat.address and "tx" in slashed.detail, slashed
        upheld = [e for e in events if e.kind == "verdict_upheld"]  # later verdicts on record
        assert {e.detail["provider"] for e in upheld} <= {cheat.address}
        assert not [e for e in events if e.kind == "verdict_rejected"]  # no honest one accused
        leases = {lease.offer_id: lease for lease in done.leases}
        assert leases["b-d0"].ends_at_s < leases["c-d0"].start_s  # dropped, then replaced

        # Every proof epoch was rooted and anchored, in order, before the bill.
        epochs = alice.proof_epochs(job.job_id)
        assert [e.epoch for e in epochs] == list(range(STEPS // 50))
        assert [e.chain_epoch for e in epochs] == list(range(len(epochs)))
        anchors = ledger.anchors(chain_job)
        assert [a.root for a in anchors[: len(epochs)]] == [e.anchored_root for e in epochs]
        # Forced errors are served (the coordinator's default): what the chain holds is each
        # root sealed, so it tells a verifier nothing of which epochs hold plants.
        assert all(e.anchored_root != e.root for e in epochs)

        # The cheat is slashed and unpaid.
        assert ledger.lease(chain_job, cheat.address).slashed
        assert ledger.lease(chain_job, cheat.address).earned_wei == 0
        (settled,) = [e for e in events if e.kind == "job_settled"]
        assert cheat.address not in settled.detail["seconds"]
        # The honest are paid what the store metered, for leases whose workers were in the
        # job; a replacement leased too late to join before the end books nothing.
        members = {w for m in alice.membership(job.job_id) for w in m.members}
        for account, offer in ((honest_a, "a-d0"), (honest_c, "c-d0")):
            joined = any(w.startswith(f"{offer[0]}-l{leases[offer].lease}-") for w in members)
            lease = ledger.lease(chain_job, account.address)
            if joined:
                assert lease.verified_s == settled.detail["seconds"][account.address] > 0
                assert lease.earned_wei <= int(settled.detail["metered_wei"][account.address])
            else:
                assert leases[offer].lease in settled.detail["unpaid_leases"]
                assert lease.earned_wei == 0
        assert any(w.startswith("a-") for w in members)  # a trained, and was paid
    finally:
        stack.close()
