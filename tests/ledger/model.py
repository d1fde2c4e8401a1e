"""What the property tests saw happen on chain, kept apart from the contract's rules.

`Record` notes each successful call's events (leases offered and accepted,
work booked with its chain time, payments, slashes, disputes) and the
deposits of each job. The invariants compare these facts with limits that
come from the market's purpose (time that passed, terms agreed, money
deposited), never with a second copy of the contract's rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shoal.spec.ledger import ChainEvent

BPS = 10_000


@dataclass
class LeaseFacts:
    price: int
    term_s: int
    accepted_at: int = 0  # chain time; 0 until accepted
    booked: dict[int, int] = field(default_factory=dict)  # epoch -> seconds
    last_booked_at: int = 0
    paid: int = 0  # pay credited (the provider withdraws it with the rest of its credit)
    paid_events: int = 0
    slashed: bool = False

    @property
    def booked_s(self) -> int:
        return sum(self.booked.values())

    @property
    def earned(self) -> int:
        return self.price * self.booked_s

    @property
    def open(self) -> bool:
        """Accepted, and neither paid nor slashed: its collateral must still be locked."""
        return bool(self.accepted_at) and not self.paid_events and not self.slashed


@dataclass
class Record:
    deposits: dict[int, int] = field(default_factory=dict)  # job -> wei deposited
    submitters: dict[int, str] = field(default_factory=dict)
    leases: dict[tuple[int, str], LeaseFacts] = field(default_factory=dict)
    open_disputes: dict[int, tuple[int, str]] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)  # facts that break a rule of purpose
    # (job, provider, price, term) that the provider itself signed an acceptance of
    signed: set[tuple[int, str, int, int]] = field(default_factory=set)

    def note(self, event: ChainEvent, now: int) -> None:
        """Fold one event of a successful call into the record."""
        a = event.args
        key = (a.get("job"), a.get("provider"))
        if event.name == "JobFunded":
            self.deposits[a["job"]] = self.deposits.get(a["job"], 0) + a["amount"]
            self.submitters[a["job"]] = a["submitter"]
        elif event.name == "LeaseOpened":
            self.leases[key] = LeaseFacts(a["price"], a["term_s"])
            if a["locked"]:  # opened with the provider's signed acceptance
                self.leases[key].accepted_at = now
                if (*key, a["price"], a["term_s"]) not in self.signed:
                    self.violations.append(f"{key} bound to terms {a['price']}, {a['term_s']} it did not sign")
        elif event.name == "LeaseAccepted":
            self.leases[key].accepted_at = now
        elif event.name == "WorkBooked":
            self._booked(self.leases[key], key, a["epoch"], a["seconds"], now)
        elif event.name == "Paid":
            lease = self.leases[key]
            if lease.slashed and a["amount"]:
                self.violations.append(f"{key} paid {a['amount']} for a slashed lease")
            lease.paid += a["amount"]
            lease.paid_events += 1
        elif event.name == "Slashed":
            if self.leases[key].paid:  # its earnings stay credited, withdrawable
                self.violations.append(f"{key} slashed after it was credited {self.leases[key].paid}")
            self.leases[key].slashed = True
        elif event.name == "JobSettled":
            self.settled.add(a["job"])
        elif event.name == "DisputeOpened":
            self.open_disputes[a["dispute"]] = key
        elif event.name == "DisputeClosed":
            self.open_disputes.pop(a["dispute"], None)

    def _booked(self, lease: LeaseFacts, key: tuple, epoch: int, seconds: int, now: int) -> None:
        if not lease.accepted_at:
            self.violations.append(f"{key} billed before it accepted")
        if epoch in lease.booked:
            self.violations.append(f"{key} booked twice for epoch {epoch}")
        lease.booked[epoch] = seconds
        if lease.booked_s > now - lease.accepted_at or lease.booked_s > lease.term_s:
            self.violations.append(f"{key} booked {lease.booked_s} s, more than time or term allow")
        lease.last_booked_at = now

    def exposure(self, provider: str) -> int:
        """What `provider`'s open leases can still earn, by the terms it accepted."""
        return sum(
            x.price * (x.term_s - x.booked_s)
            for (_, p), x in self.leases.items() if p == provider and x.open
        )

    def job_cost_bound(self, job: int, fee_bps: int) -> int:
        """The most a job's submitter may lose: unslashed booked work plus the fee on it."""
        pay = sum(x.earned for (j, _), x in self.leases.items() if j == job and not x.slashed)
        return pay + pay * fee_bps // BPS
