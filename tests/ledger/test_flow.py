"""One job's whole life, on the embedded chain and on a real JSON-RPC node.

Every account's balance is checked to the wei, gas included: the flow is the
contract's money rules seen from the outside.
"""

from __future__ import annotations

from shoal.ledger import InsufficientFunds, InvalidInput, InvalidState, OutsideTimeWindow, Unauthorized
from shoal.spec.ledger import DisputeState, JobState
from tests.ledger.conftest import Actors, Wallets, deploy

GWEI = 10**9
FEE_BPS = 200
STAKE = 10**16
COLLATERAL = 10**15  # min_stake: each lease here can earn less than that
BOND = 10**14
REWARD = 2 * BOND  # half of COLLATERAL, capped at two minimum bonds


def test_job_lifecycle(chain):
    a = Actors.of(chain)
    ledger = deploy(chain, a, fee_bps=FEE_BPS, whistleblower_bps=5000, min_stake_wei=COLLATERAL,
                    min_bond_wei=BOND, unbonding_delay_s=1000, silence_timeout_s=2000,
                    dispute_window_s=100, dispute_timeout_s=500)
    sub, (p1, p2, p3), wb, op, ref = a.submitters[0], a.providers, a.whistleblower, a.operator, a.referee
    w = Wallets(chain, [x.address for x in a.all()])
    for p in (p1, p2, p3):
        w.paid(p.address, ledger.stake(p, STAKE))

    created = ledger.create_job(sub, max_price_wei_per_s=GWEI, deposit_wei=10**15)
    job = created.returned
    w.paid(sub.address, created)
    terms = {p1.address: (GWEI, 1000), p2.address: (GWEI // 2, 1000)}
    w.paid(op.address, ledger.open_leases(op, job, terms))  # offers, accepted below by call
    # p3 accepts by signing (EIP-712, this chain's id and this contract): no transaction of its own.
    deadline = chain.w3.eth.get_block("latest")["timestamp"] + 600
    w.paid(op.address, ledger.open_accepted_leases(op, job, [ledger.sign_acceptance(p3, job, GWEI, 1000, deadline)]))
    assert ledger.stake_of(p3.address).locked_wei == COLLATERAL
    with w.refused(op.address, InvalidInput, "max price"):
        ledger.open_lease(op, job, a.stranger.address, GWEI + 1, 1000)
    with w.refused(a.stranger.address, Unauthorized, "operator"):
        ledger.open_lease(a.stranger, job, a.stranger.address, GWEI, 1000)
    w.paid(op.address, ledger.anchor(op, job, 0, b"\x01" * 32))
    with w.refused(op.address, InvalidState, "not accepted"):
        ledger.book(op, job, 0, {p1.address: 1})  # nobody is billed for a lease it did not accept
    for p in (p1, p2):
        w.paid(p.address, ledger.accept(p, job))
    assert ledger.stake_of(p1.address).locked_wei == COLLATERAL

    chain.advance_time(300)
    w.paid(op.address, ledger.anchor(op, job, 1, b"\x02" * 32))
    with w.refused(op.address, InvalidState, "in order"):
        ledger.anchor(op, job, 0, b"\x09" * 32)  # never overwritten
    assert [x.root for x in ledger.anchors(job)] == ["0x" + bytes([e + 1]).hex() * 32 for e in range(2)]
    w.paid(op.address, ledger.book(op, job, 0, {p1.address: 100, p2.address: 200, p3.address: 50}))
    assert ledger.book(op, job, 0, {p1.address: 100}) == []  # a retry books nothing twice
    w.paid(op.address, ledger.book(op, job, 1, {p1.address: 100}))
    with w.refused(op.address, InvalidInput, "passed since"):
        ledger.book(op, job, 1, {p2.address: 200})  # 400 s in 300 s of lease

    # p3 is caught: the dispute is upheld, p3's collateral goes to the whistleblower
    # (its half share, capped at two bonds) and the rest to the submitter, and p3
    # forfeits its pay.
    opened = ledger.open_dispute(wb, job, p3.address, bond_wei=BOND)
    w.paid(wb.address, opened)
    w.paid(ref.address, ledger.resolve_dispute(ref, opened.returned, upheld=True))
    assert ledger.dispute(opened.returned).state is DisputeState.upheld
    assert ledger.lease(job, p3.address).slashed

    owed = 200 * GWEI + 200 * (GWEI // 2)
    fee = owed * FEE_BPS // 10_000
    assert (ledger.job(job).owed_wei, ledger.job(job).fee_wei) == (owed, fee)
    w.paid(op.address, ledger.settle(op, job))
    escrow = ledger.job(job)
    assert escrow.state is JobState.settled
    for sender, again in (
        (op, lambda: ledger.settle(op, job)),
        (op, lambda: ledger.anchor(op, job, 2, b"\x01" * 32)),
        (op, lambda: ledger.book(op, job, 2, {p1.address: 1})),
        (sub, lambda: ledger.fund(sub, job, 1)),
    ):
        with w.refused(sender.address, InvalidState, "already settled"):
            again()

    with w.refused(a.stranger.address, OutsideTimeWindow, "dispute window"):
        ledger.payout(a.stranger, job, [p1.address])
    chain.advance_time(101)
    with w.refused(p3.address, InvalidState, "slashed"):
        ledger.claim(p3, job)
    w.paid(p1.address, ledger.claim(p1, job))  # p1 pulls its pay; the batch below skips it
    w.paid(a.stranger.address, ledger.payout(a.stranger, job, [p1.address, p2.address, p3.address]))
    with w.refused(p1.address, InvalidState, "no unpaid lease"):
        ledger.claim(p1, job)  # paid once only

    with w.refused(p3.address, InsufficientFunds, "nothing to withdraw"):
        ledger.withdraw(p3)  # the slashed cheat was credited nothing
    for acct in (sub, op, wb, p1, p2):  # p2 was credited by the batch: it withdraws like the rest
        w.paid(acct.address, ledger.withdraw(acct))
    with w.refused(sub.address, InsufficientFunds, "nothing to withdraw"):
        ledger.withdraw(sub)

    assert w.net(p1.address) == -STAKE + 200 * GWEI
    assert w.net(p2.address) == -STAKE + 200 * (GWEI // 2)
    assert w.net(p3.address) == -STAKE
    assert w.net(op.address) == fee
    assert w.net(wb.address) == REWARD  # bond returned, and the capped reward
    assert w.net(sub.address) == -owed - fee + COLLATERAL - REWARD
    assert ledger.balance() == 3 * STAKE - COLLATERAL  # stakes, less p3's slashed collateral
    assert all(ledger.stake_of(p.address).locked_wei == 0 for p in (p1, p2, p3))

    names = [e.name for e in ledger.events(job=job)]
    assert names[0] == "JobFunded" and "Slashed" in names and names.count("Paid") == 2
    assert names.index("JobSettled") < names.index("Paid")


def test_silent_operator_and_unbonding(chain):
    a = Actors.of(chain)
    ledger = deploy(chain, a, min_stake_wei=10**15, unbonding_delay_s=1000, silence_timeout_s=2000,
                    dispute_window_s=10, fee_bps=500)
    sub, p1, op = a.submitters[1], a.providers[0], a.operator
    w = Wallets(chain, [sub.address, p1.address, a.stranger.address])
    w.paid(p1.address, ledger.stake(p1, STAKE))
    created = ledger.create_job(sub, GWEI, 10**15)
    w.paid(sub.address, created)
    job = created.returned
    ledger.open_lease(op, job, p1.address, GWEI, 5000)
    w.paid(p1.address, ledger.accept(p1, job))
    chain.advance_time(1000)
    ledger.anchor(op, job, 0, b"\x05" * 32)
    ledger.book(op, job, 0, {p1.address: 1000})
    with w.refused(sub.address, OutsideTimeWindow, "silent"):
        ledger.reclaim(sub, job)
    chain.advance_time(2001)
    with w.refused(a.stranger.address, Unauthorized, "submitter"):
        ledger.reclaim(a.stranger, job)
    w.paid(sub.address, ledger.reclaim(sub, job))  # no fee: the operator went silent
    w.paid(sub.address, ledger.withdraw(sub))
    assert w.net(sub.address) == -1000 * GWEI

    with w.refused(p1.address, InsufficientFunds, "locked"):
        ledger.unbond(p1, STAKE)  # its collateral stays until the lease is paid
    chain.advance_time(11)
    w.paid(p1.address, ledger.claim(p1, job))
    w.paid(p1.address, ledger.unbond(p1, STAKE))
    with w.refused(p1.address, OutsideTimeWindow, "still unbonding"):
        ledger.release_stake(p1)
    chain.advance_time(1001)
    w.paid(p1.address, ledger.release_stake(p1))
    w.paid(p1.address, ledger.withdraw(p1))
    assert w.net(p1.address) == 1000 * GWEI
    assert ledger.balance() == 0
