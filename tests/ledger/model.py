"""A plain-Python model of the market contract's rules, for the property tests.

Each `check_*` returns the errors a call must fail with (empty: it must
succeed); each `apply_*` moves the model as a successful call moves the
contract. Written from the rules in the issue, not from the Vyper code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shoal.ledger import InsufficientFunds, InvalidInput, InvalidState, OutsideTimeWindow, Unauthorized
from shoal.spec.ledger import LedgerConfig

Errors = set[type]
BPS = 10_000


@dataclass
class JobM:
    submitter: str
    max_price: int
    escrow: int
    owed: int = 0
    epochs: int = 0
    last_active: int = 0
    settled_at: int = 0  # 0 while open


@dataclass
class LeaseM:
    price: int
    seconds: int = 0
    disputed: bool = False
    slashed: bool = False
    paid: bool = False

    @property
    def unpaid(self) -> bool:
        return not self.paid and not self.slashed and not self.disputed

    @property
    def earned(self) -> int:
        return self.price * self.seconds


@dataclass
class DisputeM:
    job: int
    provider: str
    challenger: str
    bond: int
    opened_at: int
    state: int = 1  # 1 open, 2 upheld, 3 rejected, 4 expired


@dataclass
class MarketModel:
    config: LedgerConfig
    owner: str
    operator: str
    referee: str
    jobs: dict[int, JobM] = field(default_factory=dict)
    leases: dict[tuple[int, str], LeaseM] = field(default_factory=dict)
    stakes: dict[str, int] = field(default_factory=dict)
    unbonding: dict[str, int] = field(default_factory=dict)
    release_at: dict[str, int] = field(default_factory=dict)
    credits: dict[str, int] = field(default_factory=dict)
    disputes: dict[int, DisputeM] = field(default_factory=dict)
    paid: dict[tuple[int, str], int] = field(default_factory=dict)  # pushed or claimed pay
    touched: set[str] = field(default_factory=set)  # credits changed since last looked at

    def credit(self, account: str, amount: int) -> None:
        self.credits[account] = self.credits.get(account, 0) + amount
        self.touched.add(account)

    def held(self) -> int:
        """Wei the contract must hold: open escrow, unpaid pay, stakes, bonds, credits."""
        escrow = sum(j.escrow for j in self.jobs.values() if not j.settled_at)
        unpaid = sum(
            lease.earned for (job, _), lease in self.leases.items()
            if self.jobs[job].settled_at and not lease.paid and not lease.slashed
        )
        bonds = sum(d.bond for d in self.disputes.values() if d.state == 1)
        return (escrow + unpaid + bonds + sum(self.stakes.values())
                + sum(self.unbonding.values()) + sum(self.credits.values()))

    def _open_job(self, job: int) -> Errors:
        j = self.jobs.get(job)
        return {InvalidState} if j is None or j.settled_at else set()

    # ------------------------------------------------------------ jobs
    def check_create(self, max_price: int, deposit: int) -> Errors:
        errors: Errors = set()
        if deposit == 0:
            errors.add(InsufficientFunds)
        if max_price == 0:
            errors.add(InvalidInput)
        return errors

    def check_fund(self, sender: str, job: int, amount: int) -> Errors:
        errors = self._open_job(job)
        if job in self.jobs and sender != self.jobs[job].submitter:
            errors.add(Unauthorized)
        if amount == 0:
            errors.add(InsufficientFunds)
        return errors

    def check_lease(self, sender: str, job: int, provider: str, price: int) -> Errors:
        errors = self._open_job(job)
        if sender != self.operator:
            errors.add(Unauthorized)
        if job in self.jobs and not 0 < price <= self.jobs[job].max_price:
            errors.add(InvalidInput)
        if (job, provider) in self.leases:
            errors.add(InvalidState)
        if self.stakes.get(provider, 0) < self.config.min_stake_wei:
            errors.add(InsufficientFunds)
        return errors

    def check_anchor(self, sender: str, job: int, epoch: int, root: bytes) -> Errors:
        errors = self._open_job(job)
        if sender != self.operator:
            errors.add(Unauthorized)
        if job in self.jobs and epoch != self.jobs[job].epochs:
            errors.add(InvalidState)
        if root == bytes(32):
            errors.add(InvalidInput)
        return errors

    def check_book(self, sender: str, job: int, epoch: int, work: list[tuple[str, int]]) -> Errors:
        errors = self._open_job(job)
        if sender != self.operator:
            errors.add(Unauthorized)
        if job not in self.jobs:
            return errors
        if epoch >= self.jobs[job].epochs:
            errors.add(InvalidState)
        added = 0
        for provider, seconds in work:
            lease = self.leases.get((job, provider))
            if lease is None or lease.paid or lease.slashed:
                errors.add(InvalidState)
            else:
                added += lease.price * seconds
        owed = self.jobs[job].owed + added
        if owed + owed * self.config.fee_bps // BPS > self.jobs[job].escrow:
            errors.add(InsufficientFunds)
        return errors

    def apply_book(self, job: int, work: list[tuple[str, int]], now: int) -> None:
        for provider, seconds in work:
            lease = self.leases[(job, provider)]
            lease.seconds += seconds
            self.jobs[job].owed += lease.price * seconds
        self.jobs[job].last_active = now

    def check_settle(self, sender: str, job: int) -> Errors:
        errors = self._open_job(job)
        if sender != self.operator:
            errors.add(Unauthorized)
        return errors

    def check_reclaim(self, sender: str, job: int, late: bool) -> Errors:
        errors = self._open_job(job)
        if job in self.jobs and sender != self.jobs[job].submitter:
            errors.add(Unauthorized)
        if not late:
            errors.add(OutsideTimeWindow)
        return errors

    def apply_close(self, job: int, fee_bps: int, now: int) -> None:
        j = self.jobs[job]
        fee = j.owed * fee_bps // BPS
        self.credit(self.operator, fee)
        self.credit(j.submitter, j.escrow - j.owed - fee)
        j.settled_at = now

    # ------------------------------------------------------------ paying
    def check_release(self, job: int, providers: list[str], window_over: bool) -> Errors:
        errors: Errors = set()
        if job not in self.jobs or not self.jobs[job].settled_at:
            return {InvalidState}
        if not window_over:
            errors.add(OutsideTimeWindow)
        seen = set()
        for provider in providers:
            lease = self.leases.get((job, provider))
            if lease is None or not lease.unpaid or provider in seen:
                errors.add(InvalidState)
            seen.add(provider)
        return errors

    def apply_release(self, job: int, provider: str) -> int:
        lease = self.leases[(job, provider)]
        lease.paid = True
        self.paid[(job, provider)] = self.paid.get((job, provider), 0) + lease.earned
        return lease.earned

    # ------------------------------------------------------------ slashing
    def check_slash(self, sender: str, job: int, provider: str) -> Errors:
        errors: Errors = set()
        if sender != self.referee:
            errors.add(Unauthorized)
        lease = self.leases.get((job, provider))
        if lease is None or lease.paid or lease.slashed or lease.disputed:
            errors.add(InvalidState)
        return errors

    def apply_slash(self, job: int, provider: str, amount: int, whistleblower: str) -> None:
        active, pending = self.stakes.get(provider, 0), self.unbonding.get(provider, 0)
        taken = min(amount, active + pending)
        from_active = min(taken, active)
        self.stakes[provider] = active - from_active
        self.unbonding[provider] = pending - (taken - from_active)
        reward = taken * self.config.whistleblower_bps // BPS
        self.credit(whistleblower, reward)
        lease = self.leases[(job, provider)]
        j = self.jobs[job]
        to_submitter = taken - reward
        if j.settled_at:
            to_submitter += lease.earned
        else:
            j.owed -= lease.earned
        self.credit(j.submitter, to_submitter)
        lease.slashed, lease.disputed = True, False

    def check_open_dispute(self, job: int, provider: str, bond: int, window_open: bool) -> Errors:
        errors: Errors = set()
        if bond == 0 or bond < self.config.min_bond_wei:
            errors.add(InsufficientFunds)
        if job not in self.jobs:
            return errors | {InvalidState}
        if self.jobs[job].settled_at and not window_open:
            errors.add(OutsideTimeWindow)
        lease = self.leases.get((job, provider))
        if lease is None or lease.paid or lease.slashed or lease.disputed:
            errors.add(InvalidState)
        return errors

    def check_close_dispute(self, dispute: int) -> Errors:
        d = self.disputes.get(dispute)
        return {InvalidState} if d is None or d.state != 1 else set()
