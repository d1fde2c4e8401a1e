"""The reverse auction for one job, held against brute force on small books."""

from __future__ import annotations

import collections
import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.market import Preemptible, select
from shoal.market.book import LeaseBook
from shoal.spec import Bid, FillStatus, Offer, Tenancy
from tests.market.factory import bid, bids, offer, offers

PROPERTY = settings(max_examples=150, deadline=None)


def fits(o: Offer, b: Bid) -> bool:
    """What the submitter asked for, read from the bid's fields one by one."""
    return all([
        o.price_wei_per_s <= b.max_price_wei_per_s,
        o.speed_samples_per_s >= b.min_speed_samples_per_s,
        o.memory_gb >= b.min_memory_gb,
        o.region in b.regions if b.regions else True,
        o.tenancy in b.tenancies,
    ])


def test_the_cheapest_fitting_offers_win_at_their_own_price():
    book = [offer("a", 300), offer("b", 100), offer("c", 200), offer("slow", 50, speed=1.0)]
    chosen = select(bid("j", 2, min_speed_samples_per_s=5.0), 0, book)
    assert chosen.status is FillStatus.full
    assert [o.offer_id for o in chosen.free] == ["b", "c"]


def test_ties_go_to_the_faster_device_then_the_smaller_id():
    book = [offer("z", 100, speed=10.0), offer("y", 100, speed=20.0), offer("x", 100, speed=10.0)]
    assert [o.offer_id for o in select(bid("j", 2), 0, book).free] == ["y", "x"]


def test_a_job_below_its_minimum_leases_nothing_and_says_why():
    book = [offer("a", 100), offer("dear", 900)]
    chosen = select(bid("j", 3, min_workers=2, max_price=500), 0, book)
    assert chosen.status is FillStatus.unfilled and chosen.free == ()
    assert "can reach 1 of 3 workers (minimum 2" in chosen.reason
    assert "1 more fitting offers ask above max_price_wei_per_s=500 (cheapest 900" in chosen.reason


def test_a_job_at_or_above_its_minimum_is_filled_partially():
    chosen = select(bid("j", 3, min_workers=2), 0, [offer("a"), offer("b")])
    assert chosen.status is FillStatus.partial and len(chosen.free) == 2
    assert "can reach 2 of 3" in chosen.reason


def test_held_leases_count_towards_the_job():
    assert select(bid("j", 2), 2, [offer("a")]).free == ()
    assert len(select(bid("j", 2), 1, [offer("a"), offer("b")]).free) == 1


@PROPERTY
@given(b=bids(), book=offers())
def test_the_chosen_set_is_the_cheapest_feasible_set(b, book):
    chosen = select(b, 0, book)
    fitting = [o for o in book if fits(o, b)]
    size = min(b.workers, len(fitting))
    if size < b.min_workers:
        assert chosen.status is FillStatus.unfilled and chosen.free == ()
        return
    best = min(sum(o.price_wei_per_s for o in combo)
               for combo in itertools.combinations(fitting, size))
    assert len(chosen.free) == size
    assert sum(o.price_wei_per_s for o in chosen.free) == best
    assert all(fits(o, b) for o in chosen.free)  # no winner above the max price, nor unfit


@PROPERTY
@given(b=bids(), book=offers(), seed=st.integers(0, 10**6))
def test_the_same_book_clears_the_same_way_in_any_order(b, book, seed):
    shuffled = list(book)
    random.Random(seed).shuffle(shuffled)
    assert select(b, 0, book) == select(b, 0, shuffled)


def _running(book: LeaseBook, holder: Bid, o: Offer) -> Preemptible:
    book.post(o)
    return Preemptible(book.open(holder, o, 0.0, None), o)


@PROPERTY
@given(b=bids(), book=offers(), victims=st.lists(st.integers(0, 4), max_size=6))
def test_preemption_takes_only_lower_priority_spot_leases_and_only_for_a_shortfall(b, book, victims):
    lease_book = LeaseBook()
    held = [_running(lease_book, bid(f"v{i}", priority=p), offer(f"h{i}", 100, tenancy=t))
            for i, p in enumerate(victims) for t in [list(Tenancy)[i % 2]]]
    chosen = select(b, 0, book, held)
    for taken in chosen.taken:
        assert taken.lease.tenancy is Tenancy.spot
        assert taken.lease.priority < b.priority
        assert fits(taken.offer, b)
    if chosen.taken:
        # Free fitting devices were all used before anyone was disrupted.
        assert len(chosen.free) == len([o for o in book if fits(o, b)])
    assert len(chosen.free) + len(chosen.taken) <= b.workers


@PROPERTY
@given(workers=st.integers(1, 6), least=st.integers(1, 6), max_price=st.integers(1, 12),
       book=offers(), cap=st.integers(1, 3),
       providers=st.lists(st.sampled_from("pqr"), min_size=8, max_size=8),
       held=st.lists(st.sampled_from("pqr"), max_size=2))
def test_a_cap_per_provider_leaves_the_cheapest_set_within_the_cap(workers, least, max_price,
                                                                    book, cap, providers, held):
    """The greedy choice under a cap on devices per provider, against every subset: the
    set is within the cap (counting what the job holds) and no cheaper one is."""
    b = bid("job", workers, min_workers=min(least, workers), max_price=max_price * 50,
            max_devices_per_provider=cap)
    book = [o.model_copy(update={"provider": p}) for o, p in zip(book, providers)]
    held_by = collections.Counter(held)
    chosen = select(b, len(held), book, held_by=held_by)
    fitting = [o for o in book if fits(o, b)]

    def within(combo) -> bool:
        counts = held_by + collections.Counter(o.provider for o in combo)
        return all(n <= cap for p, n in counts.items() if p in {o.provider for o in combo})

    need = max(b.workers - len(held), 0)
    size = max((k for k in range(min(need, len(fitting)) + 1)
                if any(within(c) for c in itertools.combinations(fitting, k))), default=0)
    if len(held) + size < b.min_workers or need == 0:
        assert chosen.free == ()
        return
    best = min(sum(o.price_wei_per_s for o in c)
               for c in itertools.combinations(fitting, size) if within(c))
    assert len(chosen.free) == size and within(chosen.free)
    assert sum(o.price_wei_per_s for o in chosen.free) == best
    if size < need:
        assert "max_devices_per_provider" in chosen.reason or \
            len(fitting) == size, chosen.reason


def test_preemption_takes_no_provider_past_the_cap():
    """Two spot leases of one provider's devices could be taken; under a cap of one,
    the job takes one of them and a device of another provider."""
    lease_book = LeaseBook()
    victim = bid("low", priority=0)
    running = [_running(lease_book, victim, offer(f"h{i}", 100, provider=p))
               for i, p in enumerate("ppq")]
    chosen = select(bid("high", 3, priority=1, max_devices_per_provider=1), 0, [], running)
    assert sorted(c.offer.provider for c in chosen.taken) == ["p", "q"]
    assert chosen.status is FillStatus.partial
