"""Stateful property tests: random sequences of every operation, by every role.

Each step sends a real transaction on the embedded chain, by the right role
or by anyone, and compares the outcome with `MarketModel`. After each step:
ETH is conserved to the wei (gas counted from receipts), the contract holds
exactly what it owes, and every account's credit matches the model.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shoal.ledger import InsufficientFunds, InvalidInput, InvalidState, OutsideTimeWindow, Unauthorized
from tests.ledger.machine import ACTORS, CONFIG, PROVIDERS, SECONDS, WEI, MarketHarness
from tests.ledger.model import DisputeM, Errors, JobM, LeaseM


class MarketMachine(MarketHarness, RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.reset()

    # ------------------------------------------------------------ submitters
    @rule(who=st.sampled_from(ACTORS), max_price=st.integers(0, 2_000), deposit=WEI)
    def create_job(self, who, max_price, deposit):
        sender = self.accounts[who]
        errors = self.m.check_create(max_price, deposit)
        out = self._send(errors, lambda: self.ledger.create_job(sender, max_price, deposit))
        if out:
            self.m.jobs[out.returned] = JobM(sender.address, max_price, deposit, last_active=self._ts(out))

    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), data=st.data(), amount=WEI)
    def fund(self, honest, who, data, amount):
        job = self._job(data)
        owner = self.m.jobs[job].submitter if job in self.m.jobs else self.addresses[who]
        sender = self._sender(honest, who, owner)
        errors = self.m.check_fund(sender.address, job, amount)
        if self._send(errors, lambda: self.ledger.fund(sender, job, amount)):
            self.m.jobs[job].escrow += amount

    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), data=st.data())
    def reclaim(self, honest, who, data):
        job = self._job(data, settled=False)
        owner = self.m.jobs[job].submitter if job in self.m.jobs else self.addresses[who]
        sender = self._sender(honest, who, owner)
        late = True
        if job in self.m.jobs:
            late = self._after(self.m.jobs[job].last_active + CONFIG.silence_timeout_s, strict=True)
            if late is None:
                return
        out = self._send(self.m.check_reclaim(sender.address, job, late),
                         lambda: self.ledger.reclaim(sender, job))
        if out:
            self.m.apply_close(job, 0, self._ts(out))

    # ------------------------------------------------------------ operator
    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), data=st.data(),
          provider=st.sampled_from(PROVIDERS), price=st.integers(0, 1_000))
    def open_lease(self, honest, who, data, provider, price):
        job = self._job(data, settled=False)
        sender, p = self._sender(honest, who, self.m.operator), self.addresses[provider]
        errors = self.m.check_lease(sender.address, job, p, price)
        out = self._send(errors, lambda: self.ledger.open_lease(sender, job, p, price))
        if out:
            self.m.leases[(job, p)] = LeaseM(price)
            self.m.jobs[job].last_active = self._ts(out)

    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), data=st.data(),
          skew=st.sampled_from([0, 0, 0, -1, 1]), root=st.binary(min_size=32, max_size=32))
    def anchor(self, honest, who, data, skew, root):
        job = self._job(data, settled=False)
        sender = self._sender(honest, who, self.m.operator)
        epoch = max(0, self.m.jobs[job].epochs + skew) if job in self.m.jobs else 0
        errors = self.m.check_anchor(sender.address, job, epoch, root)
        out = self._send(errors, lambda: self.ledger.anchor(sender, job, epoch, root))
        if out:
            self.m.jobs[job].epochs += 1
            self.m.jobs[job].last_active = self._ts(out)
            assert self.ledger.anchors(job)[epoch].root == "0x" + root.hex()

    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), data=st.data(), skew=st.sampled_from([1, 1, 1, 0, 2]))
    def book(self, honest, who, data, skew):
        job = self._job(data, settled=False)
        sender = self._sender(honest, who, self.m.operator)
        epoch = max(0, self.m.jobs[job].epochs - skew) if job in self.m.jobs else 0
        # The client takes a mapping, so one entry per provider.
        pairs = list(dict((p, data.draw(SECONDS)) for p in self._leased(data, job, 3)).items())
        errors = self.m.check_book(sender.address, job, epoch, pairs)
        out = self._send(errors, lambda: self.ledger.book(sender, job, epoch, dict(pairs)))
        if out:
            self.m.apply_book(job, pairs, self._ts(out))

    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), data=st.data())
    def settle(self, honest, who, data):
        job = self._job(data, settled=False)
        sender = self._sender(honest, who, self.m.operator)
        out = self._send(self.m.check_settle(sender.address, job), lambda: self.ledger.settle(sender, job))
        if out:
            self.m.apply_close(job, CONFIG.fee_bps, self._ts(out))

    # ------------------------------------------------------------ paying
    @rule(who=st.sampled_from(ACTORS), data=st.data())
    def payout(self, who, data):
        job = self._job(data, settled=True)
        sender, ps = self.accounts[who], self._leased(data, job, 3)
        over = self._window_over(job)
        if over is None:
            return
        before = {p: self.chain.balance(p) for p in ps}
        out = self._send(self.m.check_release(job, ps, over), lambda: self.ledger.payout(sender, job, ps))
        if out:
            for p in ps:
                amount = self.m.apply_release(job, p)
                paid = next(e for e in out.events if e.args["provider"] == p)
                assert paid.args["amount"] == amount and paid.args["pushed"] == (amount > 0)
                gas = out.fee_wei if p == sender.address else 0
                assert self.chain.balance(p) == before[p] + amount - gas

    @rule(data=st.data())
    def claim(self, data):
        job = self._job(data, settled=True)
        sender = self.accounts[self.addresses.index(self._leased(data, job, 1)[0])]
        over = self._window_over(job)
        if over is None:
            return
        errors = self.m.check_release(job, [sender.address], over)
        if self._send(errors, lambda: self.ledger.claim(sender, job)):
            self.m.credit(sender.address, self.m.apply_release(job, sender.address))

    @rule(who=st.sampled_from(ACTORS))
    def withdraw(self, who):
        sender = self.accounts[who]
        credit = self.m.credits.get(sender.address, 0)
        before = self.chain.balance(sender.address)
        errors = set() if credit else {InsufficientFunds}
        out = self._send(errors, lambda: self.ledger.withdraw(sender))
        if out:
            assert self.chain.balance(sender.address) == before + credit - out.fee_wei
            self.m.credits[sender.address] = 0
            self.m.touched.add(sender.address)

    # ------------------------------------------------------------ stakes
    @rule(who=st.sampled_from(PROVIDERS), amount=WEI)
    def stake(self, who, amount):
        sender = self.accounts[who]
        errors = set() if amount else {InsufficientFunds}
        if self._send(errors, lambda: self.ledger.stake(sender, amount)):
            self.m.stakes[sender.address] = self.m.stakes.get(sender.address, 0) + amount

    @rule(who=st.sampled_from(PROVIDERS), amount=WEI)
    def unbond(self, who, amount):
        sender = self.accounts[who]
        errors: Errors = set()
        if amount == 0:
            errors.add(InvalidInput)
        elif amount > self.m.stakes.get(sender.address, 0):
            errors.add(InsufficientFunds)
        out = self._send(errors, lambda: self.ledger.unbond(sender, amount))
        if out:
            self.m.stakes[sender.address] -= amount
            self.m.unbonding[sender.address] = self.m.unbonding.get(sender.address, 0) + amount
            self.m.release_at[sender.address] = self._ts(out) + CONFIG.unbonding_delay_s

    @rule(who=st.sampled_from(PROVIDERS))
    def release_stake(self, who):
        sender = self.accounts[who]
        pending = self.m.unbonding.get(sender.address, 0)
        errors: Errors = set() if pending else {InvalidState}
        if pending:
            due = self._after(self.m.release_at[sender.address], strict=False)
            if due is None:
                return
            if not due:
                errors.add(OutsideTimeWindow)
        if self._send(errors, lambda: self.ledger.release_stake(sender)):
            self.m.unbonding[sender.address] = 0
            self.m.credit(sender.address, pending)

    # ------------------------------------------------------------ referee and disputes
    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), data=st.data(), amount=WEI,
          whistleblower=st.sampled_from(ACTORS))
    def slash(self, honest, who, data, amount, whistleblower):
        job = self._job(data)
        sender = self._sender(honest, who, self.m.referee)
        p, wb = self._leased(data, job, 1)[0], self.addresses[whistleblower]
        errors = self.m.check_slash(sender.address, job, p)
        if self._send(errors, lambda: self.ledger.slash(sender, job, p, amount, wb)):
            self.m.apply_slash(job, p, amount, wb)

    @rule(who=st.sampled_from(ACTORS), data=st.data(), bond=WEI)
    def open_dispute(self, who, data, bond):
        job = self._job(data)
        sender, p = self.accounts[who], self._leased(data, job, 1)[0]
        window_open = True
        j = self.m.jobs.get(job)
        if j is not None and j.settled_at:
            window_open = self._after(j.settled_at + CONFIG.dispute_window_s, strict=False)
            if window_open is None:
                return
            window_open = not window_open
        errors = self.m.check_open_dispute(job, p, bond, window_open)
        out = self._send(errors, lambda: self.ledger.open_dispute(sender, job, p, bond))
        if out:
            self.m.disputes[out.returned] = DisputeM(job, p, sender.address, bond, self._ts(out))
            self.m.leases[(job, p)].disputed = True

    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), data=st.data(), upheld=st.booleans())
    def resolve_dispute(self, honest, who, data, upheld):
        dispute = self._dispute(data)
        sender = self._sender(honest, who, self.m.referee)
        errors = self.m.check_close_dispute(dispute)
        if sender.address != self.m.referee:
            errors.add(Unauthorized)
        if not self._send(errors, lambda: self.ledger.resolve_dispute(sender, dispute, upheld)):
            return
        d = self.m.disputes[dispute]
        self.m.leases[(d.job, d.provider)].disputed = False
        if upheld:
            d.state = 2
            self.m.credit(d.challenger, d.bond)
            self.m.apply_slash(d.job, d.provider, 2**256 - 1, d.challenger)
        else:
            d.state = 3
            self.m.credit(d.provider, d.bond)

    @rule(who=st.sampled_from(ACTORS), data=st.data())
    def expire_dispute(self, who, data):
        dispute = self._dispute(data)
        sender = self.accounts[who]
        errors = self.m.check_close_dispute(dispute)
        if not errors:
            late = self._after(self.m.disputes[dispute].opened_at + CONFIG.silence_timeout_s, strict=True)
            if late is None:
                return
            if not late:
                errors.add(OutsideTimeWindow)
        if self._send(errors, lambda: self.ledger.expire_dispute(sender, dispute)):
            d = self.m.disputes[dispute]
            d.state = 4
            self.m.leases[(d.job, d.provider)].disputed = False
            self.m.credit(d.challenger, d.bond)

    # ------------------------------------------------------------ owner and time
    @rule(honest=st.booleans(), who=st.sampled_from(ACTORS), role=st.sampled_from(["operator", "referee"]),
          new=st.sampled_from([1, 2, 8]))
    def set_role(self, honest, who, role, new):
        sender, account = self._sender(honest, who, self.m.owner), self.addresses[new]
        errors: Errors = set() if sender.address == self.m.owner else {Unauthorized}
        call = self.ledger.set_operator if role == "operator" else self.ledger.set_referee
        if self._send(errors, lambda: call(sender, account)):
            setattr(self.m, role, account)

    @rule(seconds=st.sampled_from([60, 130, 501, 1001]))
    def advance_time(self, seconds):
        self.chain.advance_time(seconds)

    @rule(data=st.data())
    def settled_job_is_final(self, data):
        """A settled job cannot be settled, funded, anchored or booked again, by its own roles."""
        job = self._job(data, settled=True)
        j = self.m.jobs.get(job)
        if j is None or not j.settled_at:
            return
        op = self.accounts[self.addresses.index(self.m.operator)]
        sub = self.accounts[self.addresses.index(j.submitter)]
        attempts = [
            lambda: self.ledger.settle(op, job),
            lambda: self.ledger.fund(sub, job, 10),
            lambda: self.ledger.anchor(op, job, j.epochs, b"\x01" * 32),
            lambda: self.ledger.book(op, job, 0, {self.addresses[5]: 1}),
        ]
        for attempt in attempts:
            self._send({InvalidState}, attempt)

    # ------------------------------------------------------------ invariants
    @invariant()
    def eth_is_conserved(self):
        assert self._total() + self.fees == self.total

    @invariant()
    def contract_holds_what_it_owes(self):
        assert self.ledger.balance() == self.m.held()

    @invariant()
    def credits_match(self):
        # Reads are slow on py-evm: look at the credits the model moved; the
        # contract-balance invariant catches money credited anywhere else.
        for address in self.m.touched:
            assert self.ledger.credit_of(address) == self.m.credits.get(address, 0), address
        self.m.touched.clear()

    @rule()
    def audit(self):
        """Every account's credit, stake and every lease, against the model."""
        for address in self.addresses:
            assert self.ledger.credit_of(address) == self.m.credits.get(address, 0), address
            stake = self.ledger.stake_of(address)
            assert stake.active_wei == self.m.stakes.get(address, 0)
            assert stake.unbonding_wei == self.m.unbonding.get(address, 0)
        for (job, provider), lease in self.m.leases.items():
            view = self.ledger.lease(job, provider)
            assert view.slashed == lease.slashed and view.disputed == lease.disputed
            assert view.unpaid == (not lease.paid)
            if not lease.paid:
                assert (view.price_wei_per_s, view.verified_s) == (lease.price, lease.seconds)

    @invariant()
    def jobs_match(self):
        for job in self.m.jobs:
            self._job_matches(job)

    @invariant()
    def pay_is_bounded(self):
        for (job, provider), amount in self.m.paid.items():
            lease = self.m.leases[(job, provider)]
            assert not lease.slashed and amount <= lease.price * lease.seconds

MarketMachine.TestCase.settings = settings(
    max_examples=20, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_market_properties = pytest.mark.slow(MarketMachine.TestCase)
