"""The harness of the market property tests: a seeded chain and the plumbing.

`World` deploys one market and seeds it once per session; every example
reverts to that snapshot. `MarketHarness` sends any call from any account,
lets the contract accept or refuse it, and records what happened; it draws
plausible arguments (mostly known jobs, leases and disputes).
"""

from __future__ import annotations

import copy
import functools

from hypothesis import event
from hypothesis import strategies as st

from shoal.ledger import Chain, ContractRevert, Ledger
from shoal.spec.ledger import LedgerConfig, TxOutcome
from tests.ledger.conftest import Actors
from tests.ledger.model import Record

GWEI = 10**9
CONFIG = LedgerConfig(fee_bps=250, whistleblower_bps=4000, min_stake_wei=10**13, min_bond_wei=10**14,
                      unbonding_delay_s=500, silence_timeout_s=1000, dispute_window_s=120,
                      dispute_timeout_s=700)
# Accounts by index into Actors.all(). The honest submitter and the honest
# provider only ever make their own role's honest moves; every other account
# (the operator and the referee included) may send anything at any time. The
# referee is trusted in one way only: it never upholds a case against the
# honest provider, who did its work.
HONEST_SUBMITTER, HONEST_PROVIDER = 4, 5
ANYONE = [0, 1, 2, 3, 6, 7, 8, 9]
PROVIDERS = [5, 6, 7, 8]
IDS = st.integers(1, 6)  # job and dispute ids: existing ones and ones never made
WEI = st.one_of(st.just(0), st.integers(1, 10**14), st.integers(10**14, 10**16))
SECONDS = st.integers(0, 400)


class World:
    """One chain and contract for all examples; each starts from the same market:
    staked providers and two open jobs (one of the honest submitter) with
    accepted leases, one epoch anchored."""

    def __init__(self) -> None:
        self.chain = Chain.embedded()
        self.actors = a = Actors.of(self.chain)
        self.ledger = led = Ledger.deploy(self.chain, a.owner, a.operator.address, a.referee.address, CONFIG)
        everyone = a.all()
        for p in a.providers:
            led.stake(p, 10**16)
        jobs = [led.create_job(everyone[i], 1000, 10**16).returned for i in (3, HONEST_SUBMITTER)]
        for job in jobs:
            led.open_leases(a.operator, job, {p.address: (1000 - 100 * i, 2000) for i, p in enumerate(a.providers)})
            for p in a.providers:
                led.accept(p, job)
            led.anchor(a.operator, job, 0, b"\x07" * 32)
        self.record = Record()
        for e in led.events():
            self.record.note(e, int(self.chain.w3.eth.get_block(e.block)["timestamp"]))
        self.snapshot = self.chain.snapshot()


@functools.cache
def world() -> World:
    return World()


class MarketHarness:
    """Plumbing shared by the rules; `reset` starts an example from the seeded market."""

    def reset(self) -> None:
        self.w = world()
        self.w.chain.revert(self.w.snapshot)
        self.w.snapshot = self.w.chain.snapshot()
        self.w.ledger.sender.reset()
        self.chain, self.ledger = self.w.chain, self.w.ledger
        self.accounts = self.w.actors.all()
        self.addresses = [x.address for x in self.accounts]
        self.rec = copy.deepcopy(self.w.record)
        self.fees: dict[str, int] = {}
        self.total = self._total()
        self.start = {x: self.wealth(x) for x in self.addresses}

    def _total(self) -> int:
        return sum(self.chain.balance(x) for x in self.addresses) + self.ledger.balance()

    def _charge(self, sender: str, wei: int) -> None:
        self.fees[sender] = self.fees.get(sender, 0) + wei

    def send(self, sender: str, call) -> list[TxOutcome]:
        """Run `call`; the contract decides. Record the events of what succeeded."""
        try:
            outcome = call()
        except ContractRevert as error:
            event(f"{error.function} refused: {type(error).__name__}")
            self._charge(sender, error.fee_wei)
            return []
        outcomes = outcome if isinstance(outcome, list) else [outcome]
        for o in outcomes:
            event(f"{o.function} ok")
            self._charge(sender, o.fee_wei)
            now = int(self.chain.w3.eth.get_block(o.block)["timestamp"])
            for e in o.events:
                self.rec.note(e, now)
        return outcomes

    def job(self, data) -> int:
        known = sorted(self.rec.deposits)
        if known and data.draw(st.integers(0, 4), label="known job") > 0:
            return data.draw(st.sampled_from(known), label="job")
        return data.draw(IDS, label="job")

    def leased(self, data, job: int, max_size: int) -> list[str]:
        """Mostly providers leased on `job`, else any providers."""
        leased = sorted(p for (j, p) in self.rec.leases if j == job)
        if leased and data.draw(st.integers(0, 4), label="leased") > 0:
            return data.draw(st.lists(st.sampled_from(leased), min_size=1, max_size=max_size, unique=True))
        picks = data.draw(st.lists(st.sampled_from(PROVIDERS), min_size=1, max_size=max_size))
        return [self.addresses[i] for i in picks]

    def dispute(self, data) -> int:
        open_ = sorted(self.rec.open_disputes)
        if open_ and data.draw(st.integers(0, 4), label="open dispute") > 0:
            return data.draw(st.sampled_from(open_), label="dispute")
        return data.draw(IDS, label="dispute")

    def wealth(self, address: str) -> int:
        """ETH in the wallet, plus gas spent, plus credit and stake in the contract."""
        stake = self.ledger.stake_of(address)
        return (self.chain.balance(address) + self.fees.get(address, 0) + self.ledger.credit_of(address)
                + stake.active_wei + stake.unbonding_wei)
