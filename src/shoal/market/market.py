"""The market as the coordinator uses it: offers, bids, clearing rounds, escrow.

One object keeps the lease book and each job's bid and escrow in step, and
every call takes the time it acts at, so the same calls always give the
same leases (the simulator and the tests replay them exactly).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from shoal.market.auction import Preemptible, rank, select
from shoal.market.book import LeaseBook
from shoal.market.errors import BidConflict, ClockWentBack, JobFinished, MarketError, UnknownJob
from shoal.market.meter import JobMeter, stop_time_within
from shoal.market.pricing import OverReference, check_offer
from shoal.spec.market import (
    Bid, DeviceLease, FillStatus, JobFill, Offer, PreemptionNotice, PriceTable,
)


@dataclass(frozen=True)
class MarketConfig:
    # Time a preempted spot lease keeps running after its notice (GCP gives
    # 30 s, AWS 2 minutes): enough for the job to snapshot and leave cleanly.
    notice_period_s: float = 30.0
    over_reference: OverReference = OverReference.reject

    def __post_init__(self) -> None:
        if not (math.isfinite(self.notice_period_s) and self.notice_period_s >= 0):
            raise MarketError(
                f"notice_period_s = {self.notice_period_s}: give a finite number of seconds ≥ 0"
            )


@dataclass
class _Account:
    """One job's bid and escrow, as the market holds them."""

    bid: Bid
    budget_wei: int
    paused: bool = False
    finished: bool = False
    barred: set[str] = field(default_factory=set)  # providers removed from the job
    # provider -> the most its leases of the job may bill in all (`allow`)
    allowances: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Clearing:
    """What one round did: a fill per job (priority order), and leases stopped for escrow."""

    at_s: float
    fills: tuple[JobFill, ...]
    stopped: tuple[DeviceLease, ...] = ()
    spent: tuple[tuple[str, str], ...] = ()  # (job, provider): allowances run out this round

    def fill(self, job: str) -> JobFill:
        return next(f for f in self.fills if f.job == job)

    @property
    def notices(self) -> tuple[PreemptionNotice, ...]:
        return tuple(n for f in self.fills for n in f.notices)

    def notices_to(self, job: str) -> tuple[PreemptionNotice, ...]:
        """Notices the coordinator must pass to `job`'s workers (a graceful leave by `ends_at_s`)."""
        return tuple(n for n in self.notices if n.lease.job == job)


class Market:
    """Offers, bids and leases for many jobs, cleared in rounds by priority."""

    def __init__(self, prices: PriceTable, config: MarketConfig | None = None) -> None:
        self.prices = prices
        self.config = config or MarketConfig()
        self.book = LeaseBook()
        self._accounts: dict[str, _Account] = {}
        self._clock_s = -math.inf

    # ------------------------------------------------------------ providers
    def post_offer(self, offer: Offer, now_s: float) -> int | None:
        """Post or re-price a device; returns its on-demand reference price (None if unknown)."""
        self._tick(now_s)
        reference = check_offer(offer, self.prices, self.config.over_reference)
        self.book.post(offer)
        return reference

    def withdraw_offer(self, offer_id: str, provider: str, now_s: float) -> list[DeviceLease]:
        """Take a device off the market; a lease on it ends now (billing stops with it)."""
        self._tick(now_s)
        self.book.withdraw(offer_id, provider)
        return [self.book.end(lease.lease, now_s) for lease in self.book.on_offer(offer_id)
                if lease.ends_at_s is None or lease.ends_at_s > now_s]

    # ------------------------------------------------------------ submitters
    def submit(self, bid: Bid, now_s: float) -> None:
        """Open a job's bid, or change it within the terms its running leases were made on."""
        self._tick(now_s)
        account = self._accounts.get(bid.job)
        if account is None:
            self._accounts[bid.job] = _Account(bid, bid.budget_wei)
            return
        if account.finished:
            raise JobFinished(bid.job)
        self._check_update(account, bid)
        account.bid, account.budget_wei = bid, bid.budget_wei
        self._trim(bid, now_s)

    def top_up(self, job: str, amount_wei: int) -> int:
        """Add to a job's escrow; returns the new budget. A paused job stays paused until resumed."""
        if amount_wei < 1:
            raise MarketError(f"top-up of {amount_wei} wei for job '{job}': give at least 1 wei")
        account = self._live(job)
        account.budget_wei += amount_wei
        return account.budget_wei

    def pause(self, job: str, now_s: float) -> list[DeviceLease]:
        """Release the job's devices now (after its checkpoint); its bid waits for `resume`."""
        self._tick(now_s)
        account = self._live(job)
        account.paused = True
        return self._release(job, now_s)

    def resume(self, job: str, now_s: float) -> None:
        self._tick(now_s)
        self._live(job).paused = False

    def finish(self, job: str, now_s: float) -> JobMeter:
        """End every lease of a finished job at once (no idle billing); returns its final bill."""
        self._tick(now_s)
        account = self._live(job)
        self._release(job, now_s)
        account.finished = True
        return self.meter(job)

    def bar(self, job: str, provider: str, now_s: float) -> None:
        """Lease none of `provider`'s devices to `job` again: it was removed from the job (a
        squatter, a cheat), and a re-posted offer must not put it straight back."""
        self._tick(now_s)
        account = self._accounts.get(job)
        if account is None:
            raise UnknownJob(job)
        account.barred.add(provider)

    def allow(self, job: str, provider: str, wei: int, now_s: float) -> None:
        """Bill `provider`'s leases of `job` at most `wei` in all: past it they stop (at the
        time it was reached) and the provider leases nothing more to the job. What a chain
        lease can book is fixed when its provider accepts it, and a job topped up past that
        must not keep the provider working for pay the chain cannot book."""
        self._tick(now_s)
        account = self._accounts.get(job)
        if account is None:
            raise UnknownJob(job)
        account.allowances[provider] = wei

    # ------------------------------------------------------------ the coordinator's loop
    def advance(self, now_s: float) -> list[DeviceLease]:
        """Stop the leases of any job whose escrow is spent, at the time it was; pause it.
        Stop a provider's leases of a job once they billed its allowance, likewise."""
        return self._advance(now_s)[0]

    def _advance(self, now_s: float) -> tuple[list[DeviceLease], list[tuple[str, str]]]:
        """`advance`'s stopped leases, and the (job, provider) allowances it found spent."""
        self._tick(now_s)
        stopped: list[DeviceLease] = []
        spent: list[tuple[str, str]] = []
        for job, account in self._accounts.items():
            if account.finished:
                continue
            stop_s = stop_time_within(self.meter(job), now_s)
            if stop_s is not None:
                account.paused = True
                stopped += self._release(job, stop_s)
            if account.allowances:
                stopped += self._spend_allowances(job, account, now_s, spent)
        return stopped, spent

    def _spend_allowances(self, job: str, account: _Account, now_s: float,
                          spent: list[tuple[str, str]]) -> list[DeviceLease]:
        """Stop the leases of each provider of `job` whose allowance they billed, at the
        time they did; bar it from the job (nothing more of it could be booked) and drop
        the allowance, which has nothing left to stop. Adds (job, provider) to `spent`."""
        by_provider: dict[str, list[DeviceLease]] = collections.defaultdict(list)
        for lease in self.book.of_job(job):
            by_provider[lease.provider].append(lease)
        stopped: list[DeviceLease] = []
        for provider, wei in list(account.allowances.items()):
            leases = by_provider.get(provider, [])
            stop_s = stop_time_within(JobMeter(job, wei, tuple(leases)), now_s)
            if stop_s is None:
                continue
            del account.allowances[provider]
            if provider not in account.barred:
                account.barred.add(provider)
                spent.append((job, provider))
            stopped += [self.book.end(lease.lease, max(stop_s, lease.start_s))
                        for lease in leases if lease.ends_at_s is None or lease.ends_at_s > stop_s]
        return stopped

    def clear(self, now_s: float) -> Clearing:
        """One auction round: jobs in priority order, each the cheapest devices that fit."""
        stopped, spent = self._advance(now_s)
        free = {o.offer_id: o for o in sorted(self.book.free_offers(now_s), key=rank)}
        preemptible = {c.lease.offer_id: c for c in self.book.preemptible(now_s)}
        fills = [self._fill(account, now_s, free, preemptible)
                 for account in sorted(self._accounts.values(),
                                       key=lambda a: (-a.bid.priority, a.bid.job))
                 if not account.finished]
        return Clearing(now_s, tuple(fills), tuple(stopped), tuple(spent))

    def meter(self, job: str) -> JobMeter:
        account = self._accounts.get(job)
        if account is None:
            raise UnknownJob(job)
        return JobMeter(job, account.budget_wei, tuple(self.book.of_job(job)))

    def bid(self, job: str) -> Bid:
        return self._live(job).bid

    # ------------------------------------------------------------ inside a round
    def _fill(self, account: _Account, now_s: float, free: dict[str, Offer],
              preemptible: dict[str, Preemptible]) -> JobFill:
        bid, held = account.bid, self.book.held(account.bid.job)
        if account.paused or self.meter(bid.job).remaining_wei(now_s) <= 0:
            return JobFill(job=bid.job, status=FillStatus.paused, held=len(held),
                           reason=f"job '{bid.job}' is paused or its escrow is spent: "
                                  "top it up and resume it")
        # Only strictly lower priorities can lose a device to this job (select checks it too).
        lower = [c for c in preemptible.values() if c.lease.priority < bid.priority
                 and c.offer.provider not in account.barred]
        offers = [o for o in free.values() if o.provider not in account.barred]
        chosen = select(bid, len(held), offers, lower, ranked=True,
                        held_by=collections.Counter(lease.provider for lease in held))
        new = [self._lease(bid, free.pop(o.offer_id), now_s) for o in chosen.free]
        notices = [self._preempt(bid, preemptible.pop(c.lease.offer_id), now_s)
                   for c in chosen.taken]
        new += [self._lease(bid, c.offer, n.ends_at_s) for c, n in zip(chosen.taken, notices)]
        return JobFill(job=bid.job, status=chosen.status, held=len(self.book.held(bid.job)),
                       new_leases=tuple(new), notices=tuple(notices), reason=chosen.reason)

    def _lease(self, bid: Bid, offer: Offer, start_s: float) -> DeviceLease:
        reference = self.prices.on_demand_wei_per_s(offer.device_kind)
        return self.book.open(bid, offer, start_s, reference)

    def _preempt(self, bid: Bid, victim: Preemptible, now_s: float) -> PreemptionNotice:
        ends_s = now_s + self.config.notice_period_s
        self.book.end(victim.lease.lease, ends_s)
        return PreemptionNotice(lease=victim.lease, by_job=bid.job, by_priority=bid.priority,
                                issued_at_s=now_s, ends_at_s=ends_s)

    # ------------------------------------------------------------ bookkeeping
    def _release(self, job: str, at_s: float) -> list[DeviceLease]:
        return [self.book.end(lease.lease, at_s) for lease in self.book.of_job(job)
                if lease.ends_at_s is None or lease.ends_at_s > at_s]

    def _trim(self, bid: Bid, now_s: float) -> None:
        """A bid that now wants fewer workers lets its dearest devices go at once."""
        held = sorted(self.book.held(bid.job), key=lambda lease: (-lease.price_wei_per_s, lease.lease))
        for lease in held[:max(0, len(held) - bid.workers)]:
            self.book.end(lease.lease, now_s)

    def _check_update(self, account: _Account, bid: Bid) -> None:
        old = account.bid
        if bid.priority != old.priority:
            raise BidConflict(
                f"job '{bid.job}': priority is fixed at {old.priority} for the job's life; "
                "finish it and submit a new job to run at another priority")
        if bid.budget_wei < account.budget_wei:
            raise BidConflict(
                f"job '{bid.job}': budget_wei {bid.budget_wei} is below the escrow already "
                f"committed ({account.budget_wei}); escrow is only added to (top up), never "
                "withdrawn while leases run")
        dearest = max((lease.price_wei_per_s for lease in self.book.held(bid.job)), default=0)
        if bid.max_price_wei_per_s < dearest:
            raise BidConflict(
                f"job '{bid.job}': max_price_wei_per_s {bid.max_price_wei_per_s} is below the "
                f"{dearest} wei/s of a device it holds; pause the job (releasing its devices) "
                "before lowering the price")

    def _live(self, job: str) -> _Account:
        account = self._accounts.get(job)
        if account is None:
            raise UnknownJob(job)
        if account.finished:
            raise JobFinished(job)
        return account

    def _tick(self, now_s: float) -> None:
        if not math.isfinite(now_s):
            raise MarketError(f"time {now_s}: pass a finite number of seconds")
        if now_s < self._clock_s:
            raise ClockWentBack(now_s, self._clock_s)
        self._clock_s = now_s
