"""A staged market for the attack tests, and the measure of who ended better off.

An attack test plays the same story twice from one chain snapshot, once
honestly and once with the attacker's moves, drives both to the end (settled,
window passed, everyone paid and withdrawn) and compares each party's wealth:
ETH in its wallet plus gas it spent, plus its stake still in the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shoal.ledger import Chain, Ledger
from tests.ledger.conftest import Actors, deploy

GWEI = 10**9
STAKE = 10**16
MIN_STAKE = 10**15  # every lease below locks this much (price x term is less)
BOND = 10**14
WINDOW_S, TIMEOUT_S, SILENCE_S, UNBOND_S = 100, 500, 2000, 50
CONFIG = dict(fee_bps=200, whistleblower_bps=5000, min_stake_wei=MIN_STAKE, min_bond_wei=BOND,
              unbonding_delay_s=UNBOND_S, silence_timeout_s=SILENCE_S, dispute_window_s=WINDOW_S,
              dispute_timeout_s=TIMEOUT_S)


@dataclass
class Stage:
    """One job with three staked providers that accepted leases and worked an epoch."""

    chain: Chain
    a: Actors
    ledger: Ledger
    job: int
    fees: dict[str, int]

    @property
    def providers(self) -> list[str]:
        return [p.address for p in self.a.providers]

    def spent(self, outcome) -> None:
        """Charge an outcome's gas to its sender (found from the transaction)."""
        for o in outcome if isinstance(outcome, list) else [outcome]:
            sender = self.chain.w3.eth.get_transaction(o.tx_hash)["from"]
            self.fees[sender] = self.fees.get(sender, 0) + o.fee_wei

    def wealth(self, address: str) -> int:
        stake = self.ledger.stake_of(address)
        return (self.chain.balance(address) + self.fees.get(address, 0) + stake.active_wei
                + stake.unbonding_wei + self.ledger.credit_of(address))

    def finish(self) -> None:
        """Settle if open, pass the window and every timeout, pay everyone, withdraw all."""
        led, a = self.ledger, self.a
        if led.job(self.job).settled_at == 0:
            self.spent(led.settle(a.operator, self.job))
        self.chain.advance_time(max(WINDOW_S, TIMEOUT_S) + 1)
        for d in range(1, led._read("dispute_count") + 1):
            if led.dispute(d).state.value == 1:
                self.spent(led.expire_dispute(a.stranger, d))
        self.spent(led.payout(a.stranger, self.job, self.providers))
        for account in a.all():
            if led.credit_of(account.address):
                self.spent(led.withdraw(account))


def staged(chain: Chain, seconds: int = 300, **config: int) -> Stage:
    """Deploy, stake, fund a job, lease to the three providers, who accept and work `seconds`."""
    a = Actors.of(chain)
    ledger = deploy(chain, a, **(CONFIG | config))
    stage = Stage(chain, a, ledger, 0, {})
    for p in a.providers:
        stage.spent(ledger.stake(p, STAKE))
    stage.job = ledger.create_job(a.submitters[0], GWEI, 10**16).returned
    ledger.open_leases(a.operator, stage.job, {p: (GWEI, 1000) for p in stage.providers})
    for p in a.providers:
        stage.spent(ledger.accept(p, stage.job))
    chain.advance_time(seconds)
    ledger.anchor(a.operator, stage.job, 0, b"\x01" * 32)
    ledger.book(a.operator, stage.job, 0, dict.fromkeys(stage.providers, seconds))
    return stage


def compare(chain: Chain, stage: Stage, honest: Callable[[Stage], None],
            attack: Callable[[Stage], None]) -> tuple[dict[str, int], dict[str, int]]:
    """Each account's wealth after the honest story and after the attack, from one snapshot."""
    snapshot = chain.snapshot()
    outcomes = []
    for story in (honest, attack):
        if outcomes:
            chain.revert(snapshot)
            stage.ledger.sender.reset()
        stage.fees = {}
        story(stage)
        stage.finish()
        outcomes.append({x.address: stage.wealth(x.address) for x in stage.a.all()})
    return outcomes[0], outcomes[1]
