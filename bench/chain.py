"""Gas and throughput of shoal's settlement contract on the embedded chain.

Prints one JSON line: `gas` (operation -> gas used), `settle_gas_per_provider`
(settling a job with N providers and crediting every provider its pay, over
N), `job_gas_per_provider` (every transaction a provider's lease costs from
open to credited, over N: the operator's batched `open_accepted_leases`
carrying each provider's EIP-712 acceptance (signature check and stake lock
included), one batched booking, its share of `settle` and of the batched
`payout`, which credits its pay and unlocks its collateral in one write; the
provider sends nothing), and next to it what getting the ETH out costs:
`withdraw_gas` (the provider's own `withdraw`, which collects all its
credit, however many jobs it holds), `job_gas_per_provider_with_withdraw_each_job`
(the worst case: one withdraw per job) and `..._withdraw_every_10_jobs`
(one withdraw per ten jobs). `job_gas_per_provider_by_call` is the first
with a batched offer and the provider's own `accept` instead of a
signature; `job_gas_by_steps` is a whole job's chain gas for different step
counts at a fixed number of epochs; then `anchors_per_s`, and the reference
they are read against: a plain ETH transfer, the least any transaction that
moves ETH to a provider can cost.

    .venv/bin/python bench/chain.py [--providers 100] [--anchors 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from eth_account import Account
from eth_hash.auto import keccak

from shoal.ledger import Chain, Ledger
from shoal.spec.ledger import LedgerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.history, as a script
from bench.history import RECORD_HELP, append_result  # noqa: E402

GWEI = 10**9
TARGETS = {"settle_gas_per_provider_max": 30_000, "job_gas_per_provider_max": 60_000,
           "anchors_per_s_min": 40}
WINDOW_S = 100  # dispute window; the bench moves the clock past it before paying


def merkle_root(leaves: list[bytes]) -> bytes:
    """Root of a keccak Merkle tree; an odd node is paired with itself."""
    level = leaves
    while len(level) > 1:
        if len(level) % 2:
            level = [*level, level[-1]]
        level = [keccak(level[i] + level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def epoch_roots(steps: int, workers: int, epochs: int, seed: int) -> list[bytes]:
    """Roots of per-epoch work records (step, worker, params hash, seed, gradient commitment)."""
    roots = []
    per_epoch = steps // epochs
    for e in range(epochs):
        leaves = []
        for step in range(e * per_epoch, (e + 1) * per_epoch):
            params = keccak(b"params" + step.to_bytes(8, "big"))
            for w in range(workers):
                record = step.to_bytes(8, "big") + w.to_bytes(4, "big") + params
                record += (seed + step).to_bytes(8, "big") + keccak(record + b"grad")
                leaves.append(keccak(record))
        roots.append(merkle_root(leaves))
    return roots


def fresh_providers(ledger: Ledger, funder, count: int, stake_wei: int) -> list:
    """`count` new accounts, funded by `funder`, each staked."""
    providers = [Account.create() for _ in range(count)]
    for p in providers:
        ledger.sender.send(funder, "transfer", p.address, "0x", 21_000, 10**17)
    for p in providers:
        ledger.stake(p, stake_wei)
    return providers


def run_job(ledger: Ledger, accounts, providers: list, roots: list[bytes], seconds: int) -> dict[str, int]:
    """One job start to finish; gas used per operation, summed."""
    owner, operator, referee, submitter = accounts[:4]
    gas: dict[str, int] = {}

    def add(name: str, outcome) -> None:
        outcomes = outcome if isinstance(outcome, list) else [outcome]
        gas[name] = gas.get(name, 0) + sum(o.gas_used for o in outcomes)

    created = ledger.create_job(submitter, GWEI, 10**18)
    add("create_job", created)
    job = created.returned
    term_s = seconds * len(roots)
    add("open_accepted_leases", ledger.open_accepted_leases(operator, job, signed(ledger, providers, job, term_s)))
    for epoch, root in enumerate(roots):
        ledger.chain.advance_time(seconds)
        add("anchor", ledger.anchor(operator, job, epoch, root))
        add("book", ledger.book(operator, job, epoch, {p.address: seconds for p in providers}))
    add("settle", ledger.settle(operator, job))
    ledger.chain.advance_time(WINDOW_S)
    add("payout", ledger.payout(operator, job, [p.address for p in providers]))
    return gas


def signed(ledger: Ledger, providers: list, job: int, term_s: int) -> list:
    """Each provider's acceptance of a lease on `job` at 1 gwei/s, valid for an hour."""
    deadline = int(ledger.chain.w3.eth.get_block("latest")["timestamp"]) + 3600
    return [ledger.sign_acceptance(p, job, GWEI, term_s, deadline) for p in providers]


def lease_costs(ledger: Ledger, accounts, providers: list, by_call: bool = False) -> dict[str, int]:
    """Gas of a one-epoch job with every provider: each step summed over providers.

    Accepted by signature in the operator's batch, or (by_call) offered in a
    batch and accepted by each provider's own transaction.
    """
    operator, submitter = accounts[1], accounts[3]
    job = ledger.create_job(submitter, GWEI, 10**18).returned
    addresses = [p.address for p in providers]
    if by_call:
        costs = {"open_leases": sum(o.gas_used for o in ledger.open_leases(
            operator, job, {a: (GWEI, 3600) for a in addresses}))}
        costs["accept"] = sum(ledger.accept(p, job).gas_used for p in providers)
    else:
        costs = {"open_accepted_leases": sum(o.gas_used for o in ledger.open_accepted_leases(
            operator, job, signed(ledger, providers, job, 3600)))}
    ledger.chain.advance_time(3600)
    ledger.anchor(operator, job, 0, keccak(b"big"))
    costs["book"] = sum(o.gas_used for o in ledger.book(operator, job, 0, dict.fromkeys(addresses, 3600)))
    costs["settle"] = ledger.settle(operator, job).gas_used
    ledger.chain.advance_time(WINDOW_S)
    costs["payout"] = sum(o.gas_used for o in ledger.payout(operator, job, addresses))
    return costs


def withdraw_gas(ledger: Ledger, providers: list) -> int:
    """Mean gas of each provider's `withdraw` of its credit (its stake stays, as between jobs)."""
    used = [ledger.withdraw(p).gas_used for p in providers]
    return round(sum(used) / len(used))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", type=int, default=100)
    parser.add_argument("--anchors", type=int, default=200)
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()

    chain = Chain.embedded()
    acc = chain.dev_accounts()
    owner, operator, referee, submitter, p1, p2, wb = acc[:7]
    config = LedgerConfig(fee_bps=100, min_stake_wei=10**15, min_bond_wei=10**15,
                          unbonding_delay_s=100, silence_timeout_s=100, dispute_window_s=WINDOW_S)
    ledger = Ledger.deploy(chain, owner, operator.address, referee.address, config)
    gas: dict[str, int] = {"deploy": ledger.deploy_outcome.gas_used}
    transfer = ledger.sender.send(owner, "transfer", wb.address, "0x", 21_000, 1)
    reference = {"eth_transfer_gas": int(transfer["gasUsed"])}

    # Single operations, each in a fresh transaction.
    gas["stake"] = ledger.stake(p1, 10**16).gas_used
    ledger.stake(p2, 10**16)
    created = ledger.create_job(submitter, GWEI, 10**18)
    job = created.returned
    gas["create_job"] = created.gas_used
    gas["fund"] = ledger.fund(submitter, job, 10**15).gas_used
    gas["open_lease"] = ledger.open_lease(operator, job, p1.address, GWEI, 3600).gas_used
    ledger.open_lease(operator, job, p2.address, GWEI, 3600)
    gas["accept"] = ledger.accept(p1, job).gas_used
    ledger.accept(p2, job)
    chain.advance_time(600)
    gas["anchor"] = ledger.anchor(operator, job, 0, keccak(b"epoch 0")).gas_used
    gas["book_1_provider"] = ledger.book(operator, job, 0, {p1.address: 600})[0].gas_used
    ledger.book(operator, job, 0, {p2.address: 600})
    dispute = ledger.open_dispute(wb, job, p2.address, 10**15)
    gas["open_dispute"] = dispute.gas_used
    gas["resolve_dispute"] = ledger.resolve_dispute(referee, dispute.returned, upheld=True).gas_used
    gas["settle"] = ledger.settle(operator, job).gas_used
    chain.advance_time(WINDOW_S)
    gas["payout_1_provider"] = ledger.payout(operator, job, [p1.address])[0].gas_used
    gas["unbond"] = ledger.unbond(p1, 10**15).gas_used
    chain.advance_time(101)
    gas["release_stake"] = ledger.release_stake(p1).gas_used
    second = ledger.create_job(submitter, GWEI, 10**18).returned
    ledger.open_lease(operator, second, p1.address, GWEI, 60)
    ledger.accept(p1, second)
    gas["slash"] = ledger.slash(referee, second, p1.address, wb.address).gas_used

    # A job with N providers: open (signed acceptances), book, settle once, credit every provider its pay.
    n = args.providers
    providers = fresh_providers(ledger, owner, n, 10**16)
    costs = lease_costs(ledger, acc, providers)
    withdraw = withdraw_gas(ledger, providers)
    by_call = lease_costs(ledger, acc, fresh_providers(ledger, owner, n, 10**16), by_call=True)
    paid_gas = costs["settle"] + costs["payout"]
    gas[f"book_{n}_providers"] = costs["book"]
    gas[f"payout_{n}_providers"] = costs["payout"]
    gas[f"open_accepted_leases_{n}_providers"] = costs["open_accepted_leases"]
    self_paid = fresh_providers(ledger, owner, 4, 10**16)
    small = ledger.create_job(submitter, GWEI, 10**18).returned
    ledger.open_leases(operator, small, {p.address: (GWEI, 3600) for p in self_paid})
    for p in self_paid:
        ledger.accept(p, small)
    chain.advance_time(3600)
    ledger.anchor(operator, small, 0, keccak(b"small"))
    ledger.book(operator, small, 0, {p.address: 3600 for p in self_paid})
    ledger.settle(operator, small)
    chain.advance_time(WINDOW_S)
    # A provider that pulls its own pay: claim into its credit, then withdraw.
    claims = [ledger.claim(p, small).gas_used for p in self_paid]
    withdrawals = [ledger.withdraw(p).gas_used for p in self_paid]
    gas["claim"], gas["withdraw"] = claims[0], withdrawals[0]
    self_gas = [c + w for c, w in zip(claims, withdrawals, strict=True)]

    # A job's chain gas depends on its epochs and providers, not its steps.
    job_gas = {}
    for steps in (100, 10_000):
        roots = epoch_roots(steps, workers=4, epochs=4, seed=steps)
        job_gas[str(steps)] = sum(run_job(ledger, acc, self_paid, roots, 60).values())

    anchored = ledger.create_job(submitter, GWEI, 10**18).returned
    roots = [keccak(i.to_bytes(8, "big")) for i in range(args.anchors)]
    start = time.perf_counter()
    for epoch, root in enumerate(roots):
        ledger.anchor(operator, anchored, epoch, root)
    anchors_per_s = args.anchors / (time.perf_counter() - start)

    per_provider = round(sum(costs.values()) / n)
    result = {
        "bench": "chain",
        "chain": "embedded (eth-tester + py-evm, Prague rules)",
        "gas": gas,
        "providers": n,
        "settle_gas_per_provider": round(paid_gas / n),
        "book_gas_per_provider": round(gas[f"book_{n}_providers"] / n),
        "job_gas_per_provider": per_provider,
        "job_gas_per_provider_parts": {k: round(v / n) for k, v in costs.items()},
        "withdraw_gas": withdraw,
        "job_gas_per_provider_with_withdraw_each_job": per_provider + withdraw,
        "job_gas_per_provider_withdraw_every_10_jobs": per_provider + round(withdraw / 10),
        "job_gas_per_provider_by_call": round(sum(by_call.values()) / n),
        "job_gas_per_provider_by_call_parts": {k: round(v / n) for k, v in by_call.items()},
        "job_gas_counts": "job_gas_per_provider: every transaction of a one-epoch job with N providers, "
                          "over N (open_accepted_leases with signed acceptances, book, settle, payout "
                          "crediting each provider); base fees of batch transactions included; the "
                          "provider sends none (by_call: it sends accept). It ends with the pay credited "
                          "in the contract, not in the provider's wallet: withdraw_gas is the provider's "
                          "own transaction (base fee included) that moves all its credit out, added "
                          "once per job (with_withdraw_each_job) or once per 10 jobs (every_10_jobs)",
        "self_claim_and_withdraw_gas_per_provider": round(sum(self_gas) / len(self_gas)),
        "job_gas_by_steps": job_gas,
        "anchors_per_s": round(anchors_per_s, 1),
        "reference": reference,
        "targets": TARGETS,
    }
    print(json.dumps(result))
    if args.record:
        append_result("chain", result)


if __name__ == "__main__":
    main()
