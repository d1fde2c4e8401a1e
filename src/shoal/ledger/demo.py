"""A short settlement story on a dev chain, for `shoal chain demo` and examples.

Providers stake, a submitter funds a job, the providers sign their
acceptance of the operator's terms and the operator opens the leases with
those signatures (locking collateral; one provider accepts by calling
`accept` instead, to show both paths), the operator anchors one Merkle
root per epoch and books verified seconds; one provider is caught cheating
and slashed through a dispute; the job settles, its dispute window passes
(a dev chain's clock is moved on), everyone is credited and withdraws.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_hash.auto import keccak

from shoal.ledger.chain import Chain
from shoal.ledger.errors import LedgerError
from shoal.ledger.market import Ledger
from shoal.spec.ledger import LedgerConfig

GWEI = 10**9


@dataclass(frozen=True)
class DemoResult:
    ledger: Ledger
    job: int
    cheat: str  # the provider that was slashed
    accounts: dict[str, str]  # role name -> address


def epoch_root(job: int, epoch: int, providers: list[str]) -> bytes:
    """A commitment to the demo's records of one epoch (one per provider).

    The training runtime anchors the Merkle root of real work records; the
    demo has no training, so it commits to what it knows: who worked when.
    """
    leaves = [keccak(f"{job}:{epoch}:{p}".encode()) for p in providers]
    return keccak(b"".join(sorted(leaves)))


def run_demo(chain: Chain, providers: int = 3, epochs: int = 2, seconds_per_epoch: int = 600) -> DemoResult:
    """Run the whole story on `chain` (a dev chain); returns where to look."""
    accounts = chain.dev_accounts()
    if providers < 2 or providers + 5 > len(accounts):
        raise LedgerError(f"the demo needs 2 to {len(accounts) - 5} providers, got {providers}")
    owner, operator, referee, submitter, whistleblower = accounts[:5]
    workers = accounts[5 : 5 + providers]
    window_s = 3600
    config = LedgerConfig(fee_bps=100, whistleblower_bps=5_000, min_stake_wei=10**16,
                          min_bond_wei=10**15, dispute_window_s=window_s)
    ledger = Ledger.deploy(chain, owner, operator.address, referee.address, config)
    for w in workers:
        ledger.stake(w, 10**17)
    job = ledger.create_job(submitter, 2 * GWEI, 10**17).returned
    term_s = epochs * seconds_per_epoch
    prices = [GWEI + i * GWEI // 4 for i in range(providers)]
    deadline = int(chain.w3.eth.get_block("latest")["timestamp"]) + 600
    signed = [ledger.sign_acceptance(w, job, price, term_s, deadline) for w, price in zip(workers[1:], prices[1:])]
    ledger.open_accepted_leases(operator, job, signed)
    ledger.open_lease(operator, job, workers[0].address, prices[0], term_s)
    ledger.accept(workers[0], job)
    addresses = [w.address for w in workers]
    for epoch in range(epochs):
        chain.advance_time(seconds_per_epoch)  # the epoch's work takes its time
        ledger.anchor(operator, job, epoch, epoch_root(job, epoch, addresses))
        ledger.book(operator, job, epoch, dict.fromkeys(addresses, seconds_per_epoch))
    cheat = workers[-1].address  # a verifier's replay disagreed with its records
    dispute = ledger.open_dispute(whistleblower, job, cheat, 10**15).returned
    ledger.resolve_dispute(referee, dispute, upheld=True)
    ledger.settle(operator, job)
    chain.advance_time(window_s)
    ledger.payout(operator, job, addresses)  # credits each provider's pay; the slashed cheat is skipped
    for account in (submitter, operator, whistleblower, *workers[:-1]):
        ledger.withdraw(account)
    roles = {"owner": owner, "operator": operator, "referee": referee,
             "submitter": submitter, "whistleblower": whistleblower}
    named = {name: a.address for name, a in roles.items()}
    named.update({f"provider{i}": w.address for i, w in enumerate(workers)})
    return DemoResult(ledger=ledger, job=job, cheat=cheat, accounts=named)
