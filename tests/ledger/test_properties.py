"""Stateful property tests of the market: every role sends anything, in any order.

Hypothesis drives any account through every contract call with plausible
and implausible arguments; the contract alone decides what succeeds. The
invariants come from what the market is for, not from its rules: ETH is
conserved; nobody is paid for a slashed lease; locked stake covers what open
leases can still earn; nothing is booked before acceptance, twice for an
epoch, or beyond the time and term agreed. At the end of each run the
market is wound up honestly, and the honest provider must have been credited
in full for its booked work and be able to withdraw it, and the honest
submitter must have lost no more than the verified work it bought (plus the
fee on it).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shoal.ledger.acceptance import acceptance_row, sign_acceptance
from tests.ledger.machine import (
    ANYONE,
    CONFIG,
    HONEST_PROVIDER,
    HONEST_SUBMITTER,
    SECONDS,
    WEI,
    MarketHarness,
)

WHO = st.sampled_from(ANYONE)


class MarketMachine(MarketHarness, RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.reset()

    def _as(self, who: int):
        return self.accounts[who]

    # ------------------------------------------------------------ jobs and escrow
    @rule(who=st.sampled_from([*ANYONE, HONEST_SUBMITTER]), max_price=st.integers(0, 2_000), deposit=WEI)
    def create_job(self, who, max_price, deposit):
        s = self._as(who)
        self.send(s.address, lambda: self.ledger.create_job(s, max_price, deposit))

    @rule(who=st.sampled_from([*ANYONE, HONEST_SUBMITTER]), data=st.data(), amount=WEI)
    def fund(self, who, data, amount):
        s, job = self._as(who), self.job(data)
        self.send(s.address, lambda: self.ledger.fund(s, job, amount))

    @rule(who=st.sampled_from([*ANYONE, HONEST_SUBMITTER, HONEST_PROVIDER]), data=st.data())
    def reclaim(self, who, data):
        s, job = self._as(who), self.job(data)
        self.send(s.address, lambda: self.ledger.reclaim(s, job))

    # ------------------------------------------------------------ operator's moves, by anyone
    @rule(who=WHO, data=st.data(), providers=st.lists(st.sampled_from([5, 6, 7, 8, 9]), min_size=1, max_size=3),
          price=st.integers(0, 1_200), term_s=st.integers(0, 3000))
    def open_leases(self, who, data, providers, price, term_s):
        s, job = self._as(who), self.job(data)
        terms = {self.addresses[p]: (price, term_s) for p in providers}
        self.send(s.address, lambda: self.ledger.open_leases(s, job, terms))

    @rule(who=WHO, data=st.data(), providers=st.lists(st.sampled_from([5, 6, 7, 8, 9]), min_size=1, max_size=3),
          signer=st.sampled_from([None, None, 0, 9]), price=st.integers(1, 1_200), term_s=st.integers(1, 3000),
          altered=st.booleans())
    def open_accepted_leases(self, who, data, providers, signer, price, term_s, altered):
        # Acceptances signed by the provider (None) or by another key, for these
        # terms or altered after signing; sent past the client's own check.
        s, job = self._as(who), self.job(data)
        deadline = self.chain.w3.eth.get_block("latest")["timestamp"] + 100
        rows = []
        for p in providers:
            provider = self.accounts[p]
            key = provider if signer is None else self.accounts[signer]
            signed = sign_acceptance(key, self.chain.chain_id, self.ledger.address, job, price, term_s, deadline)
            changes = {"provider": provider.address} | ({"term_s": term_s + 1} if altered else {})
            signed = signed.model_copy(update=changes)
            if signer is None:
                self.rec.signed.add((job, provider.address, price, term_s))
            rows.append(acceptance_row(signed))
        self.send(s.address, lambda: self.ledger._transact(s, "open_accepted_leases", job, rows, items=len(rows)))

    @rule(who=WHO, data=st.data(), skew=st.sampled_from([0, 0, 0, -1, 1]), root=st.binary(min_size=32, max_size=32))
    def anchor(self, who, data, skew, root):
        s, job = self._as(who), self.job(data)
        epoch = max(0, self.ledger.job(job).epochs + skew) if job in self.rec.deposits else 0
        self.send(s.address, lambda: self.ledger.anchor(s, job, epoch, root))

    @rule(who=WHO, data=st.data(), epoch=st.integers(0, 4), raw=st.booleans())
    def book(self, who, data, epoch, raw):
        s, job = self._as(who), self.job(data)
        pairs = {p: data.draw(SECONDS) for p in self.leased(data, job, 3)}
        if raw:  # straight to the contract, past the client's idempotence
            self.send(s.address, lambda: self.ledger._transact(
                s, "book", job, epoch, list(pairs), list(pairs.values()), items=len(pairs)))
        else:
            self.send(s.address, lambda: self.ledger.book(s, job, epoch, pairs))

    @rule(who=WHO, data=st.data())
    def settle(self, who, data):
        s, job = self._as(who), self.job(data)
        self.send(s.address, lambda: self.ledger.settle(s, job))

    # ------------------------------------------------------------ providers
    @rule(who=st.sampled_from([*ANYONE, HONEST_PROVIDER]), amount=WEI)
    def stake(self, who, amount):
        s = self._as(who)
        self.send(s.address, lambda: self.ledger.stake(s, amount))

    @rule(who=st.sampled_from([*ANYONE, HONEST_PROVIDER]), data=st.data())
    def accept(self, who, data):
        s, job = self._as(who), self.job(data)
        self.send(s.address, lambda: self.ledger.accept(s, job))

    @rule(who=st.sampled_from([*ANYONE, HONEST_PROVIDER]), amount=WEI)
    def unbond(self, who, amount):
        s = self._as(who)
        self.send(s.address, lambda: self.ledger.unbond(s, amount))

    @rule(who=st.sampled_from([*ANYONE, HONEST_PROVIDER]))
    def release_stake(self, who):
        s = self._as(who)
        self.send(s.address, lambda: self.ledger.release_stake(s))

    # ------------------------------------------------------------ paying
    @rule(who=WHO, data=st.data())
    def payout(self, who, data):
        s, job = self._as(who), self.job(data)
        providers = self.leased(data, job, 4)
        self.send(s.address, lambda: self.ledger.payout(s, job, providers))

    @rule(who=st.sampled_from([*ANYONE, HONEST_PROVIDER]), data=st.data())
    def claim(self, who, data):
        s, job = self._as(who), self.job(data)
        self.send(s.address, lambda: self.ledger.claim(s, job))

    @rule(who=st.sampled_from([*ANYONE, HONEST_PROVIDER, HONEST_SUBMITTER]))
    def withdraw(self, who):
        s = self._as(who)
        self.send(s.address, lambda: self.ledger.withdraw(s))

    # ------------------------------------------------------------ referee's moves and disputes, by anyone
    @rule(who=WHO, data=st.data(), whistleblower=WHO)
    def slash(self, who, data, whistleblower):
        s, job = self._as(who), self.job(data)
        provider = self.leased(data, job, 1)[0]
        if s.address == self.ledger.roles()["referee"] and provider == self.addresses[HONEST_PROVIDER]:
            return  # the trusted referee does not punish honest work
        self.send(s.address, lambda: self.ledger.slash(s, job, provider, self.addresses[whistleblower]))

    @rule(who=WHO, data=st.data(), bond=WEI)
    def open_dispute(self, who, data, bond):
        s, job = self._as(who), self.job(data)
        provider = self.leased(data, job, 1)[0]
        self.send(s.address, lambda: self.ledger.open_dispute(s, job, provider, bond))

    @rule(who=WHO, data=st.data(), upheld=st.booleans())
    def resolve_dispute(self, who, data, upheld):
        s, dispute = self._as(who), self.dispute(data)
        case = self.rec.open_disputes.get(dispute)
        if case and case[1] == self.addresses[HONEST_PROVIDER] and s.address == self.ledger.roles()["referee"]:
            upheld = False
        self.send(s.address, lambda: self.ledger.resolve_dispute(s, dispute, upheld))

    @rule(who=WHO, data=st.data())
    def expire_dispute(self, who, data):
        s, dispute = self._as(who), self.dispute(data)
        self.send(s.address, lambda: self.ledger.expire_dispute(s, dispute))

    # ------------------------------------------------------------ owner and time
    @rule(who=WHO, role=st.sampled_from(["operator", "referee"]), new=st.sampled_from([1, 2, 8]))
    def set_role(self, who, role, new):
        s = self._as(who)
        call = self.ledger.set_operator if role == "operator" else self.ledger.set_referee
        self.send(s.address, lambda: call(s, self.addresses[new]))

    @rule(seconds=st.sampled_from([60, 130, 501, 1001]))
    def advance_time(self, seconds):
        self.chain.advance_time(seconds)

    # ------------------------------------------------------------ invariants
    @invariant()
    def eth_is_conserved(self):
        assert self._total() + sum(self.fees.values()) == self.total

    @invariant()
    def no_rule_of_purpose_was_broken(self):
        assert not self.rec.violations, self.rec.violations

    @invariant()
    def locked_stake_covers_what_open_leases_can_earn(self):
        for provider in {p for (_, p) in self.rec.leases}:
            stake = self.ledger.stake_of(provider)
            assert self.rec.exposure(provider) <= stake.locked_wei <= stake.active_wei, provider

    @rule()
    def contract_can_pay_every_credit_and_stake(self):
        """Solvency (a rule, not an invariant: it reads every account, which is slow)."""
        owed = sum(self.ledger.credit_of(x) for x in self.addresses)
        for x in self.addresses:
            stake = self.ledger.stake_of(x)
            owed += stake.active_wei + stake.unbonding_wei
        assert self.ledger.balance() >= owed

    def teardown(self):
        if not hasattr(self, "rec"):
            return
        self.wind_up()
        honest_p, honest_s = self.addresses[HONEST_PROVIDER], self.addresses[HONEST_SUBMITTER]
        for (job, p), lease in self.rec.leases.items():
            if p == honest_p:
                assert not lease.slashed and lease.paid == lease.earned, (job, lease)
        assert self.ledger.stake_of(honest_p).locked_wei == 0
        earned = sum(x.earned for (_, p), x in self.rec.leases.items() if p == honest_p)
        assert self.wealth(honest_p) - self.start[honest_p] == earned
        jobs = [j for j, s in self.rec.submitters.items() if s == honest_s]
        bound = sum(self.rec.job_cost_bound(j, CONFIG.fee_bps) for j in jobs)
        assert self.wealth(honest_s) - self.start[honest_s] >= -bound

    def honest_provider_withdraws_its_credit(self):
        """Its credit (earnings, released stake) reaches its wallet, whatever others did."""
        honest = self.accounts[HONEST_PROVIDER]
        credit = self.ledger.credit_of(honest.address)
        if credit:
            before = self.chain.balance(honest.address)
            [done] = self.send(honest.address, lambda: self.ledger.withdraw(honest))
            assert self.chain.balance(honest.address) - before + done.fee_wei == credit
        assert self.ledger.credit_of(honest.address) == 0

    def wind_up(self):
        """Let every timeout pass, close disputes, settle, pay everyone: as honest parties would."""
        roles = self.ledger.roles()
        operator = self.accounts[self.addresses.index(roles["operator"])]
        self.chain.advance_time(max(CONFIG.dispute_timeout_s, CONFIG.silence_timeout_s) + 1)
        for d in sorted(self.rec.open_disputes):
            self.send(operator.address, lambda d=d: self.ledger.expire_dispute(operator, d))
        for job in sorted(set(self.rec.deposits) - self.rec.settled):
            self.send(operator.address, lambda job=job: self.ledger.settle(operator, job))
        self.chain.advance_time(CONFIG.dispute_window_s + 1)
        for job in sorted(self.rec.deposits):
            providers = sorted(p for (j, p) in self.rec.leases if j == job)
            self.send(operator.address, lambda job=job, ps=providers: self.ledger.payout(operator, job, ps))
        self.honest_provider_withdraws_its_credit()
        assert not self.rec.open_disputes
        self.contract_can_pay_every_credit_and_stake()
        self.eth_is_conserved()
        self.no_rule_of_purpose_was_broken()


MarketMachine.TestCase.settings = settings(
    max_examples=15, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# In-process on the embedded chain, whose clock the machine moves: nothing here is timed.
test_market_properties = pytest.mark.parallel_ok(pytest.mark.slow(MarketMachine.TestCase))
