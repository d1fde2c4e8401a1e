"""A coordinator and agents as separate processes: across namespaced hosts, a
job leases two devices, one agent's host is killed whole, the market leases
the third, its worker joins with state, and the job finishes with every
lease ended; on one host, a SIGKILLed coordinator comes back mid-job."""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest
from eth_account import Account

from shoal.client.http import CoordinatorClient
from shoal.spec.coordinator import JobStatus, JobSubmission
from tests.conftest import free_port
from tests.coordinator.e2e import (
    Stack, job_toml, key_file, kill_group, submitter, wait_healthy,
)
from tests.harness import network  # noqa: F401  (the namespaced-hosts fixture)

PRICE = 1_000_000
STEPS = 1500


def wait_for(read, ok, timeout_s: float, stack: Stack, what: str):
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = read()
        if ok(value):
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s} s; last {value}\n{stack.logs()}")


def hardhat_in(host, tmp_path):
    """A real JSON-RPC chain (Hardhat) on `host`, reachable by every other host."""
    import os

    from tests.ledger.conftest import HARDHAT_DIR, hardhat_binary, wait_for_node

    url = f"http://{host.address}:8545"
    log = tmp_path / "hardhat.log"
    node = host.popen([str(hardhat_binary()), "node", "--hostname", host.address, "--port", "8545"],
                      log=log, cwd=HARDHAT_DIR,
                      env={**os.environ, "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true"})
    wait_for_node(url, node, log)
    return url


@pytest.mark.slow
def test_a_killed_agent_host_is_replaced_and_the_chain_pays_what_the_store_billed(
        network, tmp_path, cli_env):
    from eth_account import Account

    from shoal.ledger import Chain, Ledger
    from shoal.spec.ledger import LedgerConfig

    hosts = {name: network.add_host(name) for name in ("ctl", "a", "b", "c")}
    port, ctl = 8470, hosts["ctl"]
    stack = Stack(tmp_path, {**cli_env, "SHOAL_COORDINATOR_DATA_DIR": str(tmp_path / "coord")})
    try:
        chain = Chain.rpc(hardhat_in(ctl, tmp_path))
        owner, operator, referee, alice_account, *providers = chain.dev_accounts()[:7]
        ledger = Ledger.deploy(chain, owner, operator.address, referee.address,
                               LedgerConfig(min_stake_wei=10**15))
        for provider in providers:
            ledger.stake(provider, 10**18)
        budget = 10**15
        chain_job = ledger.create_job(alice_account, 2 * PRICE, budget).returned
        coordinator = stack.coordinator(
            f"sqlite:///{tmp_path}/store.db", ctl.address, port, host=ctl,
            operator=Account.create().address,
            chain=(chain.url, ledger.address, str(key_file(tmp_path / "operator.key", operator))))
        url = stack.url(ctl.address, port)  # https: bound beyond loopback, it serves TLS
        wait_healthy(url, coordinator, pin=stack.cert_pin)
        # Posing as devices 4× slower than this CPU: a replacement has time to join.
        for i, name in enumerate("abc"):
            stack.agent(name, url, PRICE + i, host=hosts[name], slowdown=4.0,
                        account=providers[i])
        alice = submitter(url, tmp_path, alice_account, pin=stack.cert_pin)
        wait_for(lambda: sum(len(p.offers) for p in alice.providers()), lambda n: n == 3, 120,
                 stack, "three agents offering")
        from shoal.spec.coordinator import Registration

        alice.register(Registration(role="submitter", name="alice"))
        job = alice.submit(JobSubmission(name="e2e", job_file=job_toml(tmp_path / "ckpt", STEPS),
                                         workers=2, min_workers=2, max_price_wei_per_s=2 * PRICE,
                                         budget_wei=budget, chain_job=chain_job))
        run_dir = tmp_path / "coord" / "jobs" / job.job_id
        wait_for(lambda: (run_dir / "epochs.jsonl").exists(), bool, 120, stack, "first epoch")
        time.sleep(3)  # a few steps in
        held = {lease.offer_id for lease in alice.job(job.job_id).leases if lease.ends_at_s is None}
        assert held == {"a-d0", "b-d0"}  # the two cheapest
        killed_at = time.time()
        hosts["a"].kill()  # the machine is gone: agent, launcher and worker at once

        done = wait_for(lambda: alice.job(job.job_id), lambda j: j.status in (
            JobStatus.finished, JobStatus.failed), 300, stack, "job end")
        assert done.status is JobStatus.finished, stack.logs()
        leases = {lease.offer_id: lease for lease in done.leases}
        assert leases["a-d0"].ends_at_s < leases["c-d0"].start_s  # replaced, after the kill
        assert leases["c-d0"].start_s >= killed_at
        assert all(lease.ends_at_s is not None for lease in done.leases)  # released at the end
        final = json.loads((run_dir / "final.json").read_text())["final"]
        assert final["steps"] == STEPS
        epochs = [json.loads(line) for line in (run_dir / "epochs.jsonl").read_text().splitlines()]
        assert any(any(m.startswith("c-") for m in e.get("members", [])) for e in epochs), epochs
        reasons = [e.detail.get("reason") for e in alice.events() if e.kind == "offer_withdrawn"]
        assert "agent lost" in reasons
        assert done.spent_wei == sum(
            lease.price_wei_per_s * int(lease.ends_at_s - lease.start_s) for lease in done.leases)

        # The store and the chain agree on who was leased and what each was paid.
        (settled,) = [e for e in alice.events(job=job.job_id) if e.kind == "job_settled"]
        assert set(settled.detail["seconds"]) == {p.address for p in providers}  # c included
        for account in providers:
            lease = ledger.lease(chain_job, account.address)
            assert lease.verified_s == settled.detail["seconds"][account.address] > 0
            assert lease.earned_wei == int(settled.detail["wei"][account.address])
            assert lease.earned_wei <= int(settled.detail["metered_wei"][account.address])
        escrow = ledger.job(chain_job)
        assert escrow.settled_at > 0
        assert escrow.owed_wei == sum(int(w) for w in settled.detail["wei"].values())
    finally:
        stack.close()


@pytest.mark.slow
def test_a_sigkilled_coordinator_comes_back_and_the_job_carries_on(tmp_path, cli_env):
    port = free_port()
    url, store = f"http://127.0.0.1:{port}", f"sqlite:///{tmp_path}/store.db"
    stack = Stack(tmp_path, {**cli_env, "SHOAL_COORDINATOR_DATA_DIR": str(tmp_path / "coord")})
    try:
        coordinator = stack.coordinator(store, "127.0.0.1", port)
        wait_healthy(url, coordinator)
        for i, name in enumerate("ab"):
            stack.agent(name, url, PRICE + i, slowdown=4.0)
        alice = submitter(url, tmp_path)
        wait_for(lambda: sum(len(p.offers) for p in alice.providers()), lambda n: n == 2, 120,
                 stack, "two agents offering")
        from shoal.spec.coordinator import Registration

        alice.register(Registration(role="submitter", name="alice"))
        job = alice.submit(JobSubmission(name="e2e", job_file=job_toml(tmp_path / "ckpt", 800),
                                         workers=2, min_workers=2, max_price_wei_per_s=2 * PRICE,
                                         budget_wei=10**15))
        run_dir = tmp_path / "coord" / "jobs" / job.job_id
        wait_for(lambda: (run_dir / "epochs.jsonl").exists(), bool, 120, stack, "first epoch")
        time.sleep(2)
        before = alice.job(job.job_id)
        kill_group(coordinator)  # the job host is in a session of its own: it keeps serving
        time.sleep(4)  # an outage longer than the agents' timeout
        assert not (run_dir / "final.json").exists(), "the job ended before the restart"
        wait_healthy(url, stack.coordinator(store, "127.0.0.1", port))

        done = wait_for(lambda: alice.job(job.job_id), lambda j: j.status in (
            JobStatus.finished, JobStatus.failed), 300, stack, "job end")
        assert done.status is JobStatus.finished, stack.logs()
        assert json.loads((run_dir / "final.json").read_text())["final"]["steps"] == 800
        epochs = [json.loads(line) for line in (run_dir / "epochs.jsonl").read_text().splitlines()]
        assert len(epochs) == 1, epochs  # the workers never noticed the outage
        assert [lease.lease for lease in done.leases] == [lease.lease for lease in before.leases]
        kinds = [e.kind for e in alice.events(job=job.job_id)]
        assert "offer_withdrawn" not in [e.kind for e in alice.events()]  # no one reaped
        # The job ended once, finished; the agent of its checkpoint writer may still carry
        # the last checkpoint after that (the submitter fetches it), so that event can follow.
        assert kinds.count("job_finished") == 1, kinds
        assert not {"job_failed", "job_cancelled", "job_paused", "workers_lost"} & set(kinds), kinds
        assert set(kinds[kinds.index("job_finished") + 1:]) <= {"checkpoint_carried"}, kinds
    finally:
        stack.close()


def run_to_end(alice, stack, tmp_path, name: str, budget: int, steps: int, on_pause=None):
    # One device: its share is the whole batch whoever holds it, so the arithmetic of a
    # paused run and an unpaused one is the same and their parameters can match bit for bit
    # (with several devices, shares follow measured speeds, which no two runs share).
    job = alice.submit(JobSubmission(name=name, job_file=job_toml(tmp_path / f"ckpt-{name}", steps),
                                     workers=1, max_price_wei_per_s=2 * PRICE, budget_wei=budget))
    if on_pause is not None:
        paused = wait_for(lambda: alice.job(job.job_id), lambda j: j.status in (
            JobStatus.paused, JobStatus.finished, JobStatus.failed), 300, stack, "pause")
        on_pause(job.job_id, paused)
    done = wait_for(lambda: alice.job(job.job_id), lambda j: j.status in (
        JobStatus.finished, JobStatus.failed), 300, stack, f"{name} end")
    assert done.status is JobStatus.finished, stack.logs()
    run_dir = tmp_path / "coord" / "jobs" / job.job_id
    return done, json.loads((run_dir / "final.json").read_text())["final"], run_dir


@pytest.mark.slow
def test_a_job_out_of_escrow_pauses_and_finishes_on_another_machine_as_if_never_paused(
        tmp_path, cli_env):
    """Paused on agent a, whose machine is then lost with its disk; topped up, the job
    resumes on agent b from the checkpoint a's worker wrote as it left, carried by the
    coordinator, and ends with the parameters of a run never paused, bit for bit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stack = Stack(tmp_path, {**cli_env, "SHOAL_COORDINATOR_DATA_DIR": str(tmp_path / "coord")})
    try:
        wait_healthy(url, stack.coordinator(f"sqlite:///{tmp_path}/store.db", "127.0.0.1", port))
        agent_a = stack.agent("a", url, PRICE, slowdown=4.0)
        alice = submitter(url, tmp_path)
        wait_for(lambda: sum(len(p.offers) for p in alice.providers()), lambda n: n == 1, 120,
                 stack, "the agent offering")
        from shoal.spec.coordinator import Registration

        alice.register(Registration(role="submitter", name="alice"))
        steps = 2000

        def top_up(job_id, paused):
            assert paused.status is JobStatus.paused, "the job ended before its escrow did"
            assert paused.spent_wei <= paused.budget_wei  # never billed past the escrow
            assert all(lease.ends_at_s is not None for lease in paused.leases)
            logs = wait_for(lambda: "".join(p.read_text() for p in tmp_path.glob(
                "a/lease-*/run-*/*.log")), lambda text: "last worker leaving: checkpoint of step"
                in text, 60, stack, "the leaving worker's checkpoint")
            left_at = int(re.search(r"last worker leaving: checkpoint of step (\d+)", logs)[1])
            carried = wait_for(lambda: alice.carried_checkpoint(job_id),
                               lambda c: c is not None and c.step == left_at, 60, stack,
                               f"step {left_at} carried to the coordinator")
            assert carried.lease == paused.leases[0].lease
            # Written where the agent chose, not where the job file said.
            assert list((tmp_path / "a" / "jobs" / job_id / "checkpoints").glob("*.safetensors"))
            assert not (tmp_path / "ckpt-paused").exists()
            kill_group(agent_a)  # the machine is lost, and its disk with it
            shutil.rmtree(tmp_path / "a")
            # Posing as slow only kept the first run short of its end before the escrow ran
            # out; the rest runs at this machine's speed (the arithmetic is the same).
            stack.agent("b", url, PRICE)
            wait_for(lambda: [o.offer_id for p in alice.providers() for o in p.offers
                              if not o.withdrawn], lambda ids: ids == ["b-d0"], 120, stack,
                     "agent a reaped and agent b offering")
            alice.top_up(job_id, 10**12)
            return left_at

        paused_run, paused_final, run_dir = run_to_end(
            alice, stack, tmp_path, "paused", budget=PRICE * 20, steps=steps, on_pause=top_up)
        logs_b = "".join(p.read_text() for p in tmp_path.glob("b/lease-*/run-*/*.log"))
        assert re.search(r"restored step [1-9][0-9]* from", logs_b), stack.logs()
        assert "starts over" not in logs_b
        epochs = [json.loads(line) for line in (run_dir / "epochs.jsonl").read_text().splitlines()]
        assert epochs[-1]["reason"] == "join" and len(epochs) >= 2, epochs  # resumed from disk
        whole_run, whole_final, _ = run_to_end(alice, stack, tmp_path, "whole", budget=10**12,
                                               steps=steps)
        assert paused_final == whole_final  # same steps, same parameters, bit for bit
        assert len(paused_run.leases) == 2 and len(whole_run.leases) == 1
        assert {lease.offer_id for lease in paused_run.leases} == {"a-d0", "b-d0"}
    finally:
        stack.close()


@pytest.mark.slow
def test_a_spot_notice_is_a_graceful_leave_and_the_preempted_job_comes_back(tmp_path, cli_env):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**cli_env, "SHOAL_COORDINATOR_DATA_DIR": str(tmp_path / "coord"),
           "SHOAL_COORDINATOR_NOTICE_PERIOD_S": "3"}
    stack = Stack(tmp_path, env)
    boss = Account.create()  # an operator: priorities above 0 are granted (test_signed_requests)
    try:
        wait_healthy(url, stack.coordinator(f"sqlite:///{tmp_path}/store.db", "127.0.0.1", port,
                                            operator=boss.address))
        stack.agent("a", url, PRICE, slowdown=4.0)  # one spot device for two jobs
        alice = submitter(url, tmp_path)
        wait_for(lambda: sum(len(p.offers) for p in alice.providers()), lambda n: n == 1, 120,
                 stack, "the agent offering")
        from shoal.spec.coordinator import Grant, Registration

        alice.register(Registration(role="submitter", name="alice"))
        CoordinatorClient(url, boss).request("POST", "/v1/grants", Grant(
            address=alice.account.address, role="submitter", name="alice", max_priority=10))

        def submit(name, steps, priority):
            return alice.submit(JobSubmission(
                name=name, job_file=job_toml(tmp_path / f"ckpt-{name}", steps), workers=1,
                max_price_wei_per_s=2 * PRICE, budget_wei=10**12, priority=priority))

        low = submit("low", 1500, priority=0)
        low_dir = tmp_path / "coord" / "jobs" / low.job_id
        wait_for(lambda: (low_dir / "epochs.jsonl").exists(), bool, 120, stack, "low starts")
        time.sleep(3)
        high = submit("high", 200, priority=10)  # takes the device, with notice
        high_done = wait_for(lambda: alice.job(high.job_id), lambda j: j.status in (
            JobStatus.finished, JobStatus.failed), 300, stack, "high ends")
        assert high_done.status is JobStatus.finished
        low_done = wait_for(lambda: alice.job(low.job_id), lambda j: j.status in (
            JobStatus.finished, JobStatus.failed), 300, stack, "low ends")
        assert low_done.status is JobStatus.finished, stack.logs()
        assert json.loads((low_dir / "final.json").read_text())["final"]["steps"] == 1500

        first, *_, last = sorted(low_done.leases, key=lambda lease: lease.lease)
        (taken,) = high_done.leases
        assert first.ends_at_s <= taken.start_s  # the notice ran out before the new holder began
        assert last.start_s >= taken.ends_at_s  # the device came back when high was done
        logs = "".join(p.read_text() for p in tmp_path.glob("a/lease-*/worker.log"))
        assert "spot notice" in (tmp_path / "a.log").read_text()
        assert "last worker leaving: checkpoint of step" in "".join(
            p.read_text() for p in tmp_path.glob("a/lease-*/run-*/*.log")), logs
    finally:
        stack.close()
