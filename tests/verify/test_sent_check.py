"""What binds the part each member put in an all-reduce to what it committed:
sketches (pure) and the declarations every member checks after a voted step,
through a real rendezvous store, one thread per member."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from shoal.verify import sketch as sk
from shoal.train.sync.exchange import GradientExchange
from shoal.train.group import EpochGroup
from shoal.verify.sent_check import Sent, SentCheck

SEED = "ab" * 32


def test_sketches_are_linear_so_the_members_add_up_to_the_sum():
    torch.manual_seed(0)
    parts = [[torch.randn(1000), torch.randn(37)] for _ in range(4)]
    summed = [sum(p[i] for p in parts) for i in range(2)]
    *mine, total = sk.sketch(SEED, *parts, summed)
    assert len(total) == sk.ROWS
    assert sk.adds_up([sk.finite(m) for m in mine], sk.finite(total), 1e-5)


@pytest.mark.parametrize("factor", [1.001, 1.1, 10.0, -1.0])
def test_a_part_sent_other_than_declared_does_not_add_up(factor):
    torch.manual_seed(1)
    parts = [[torch.randn(5000)] for _ in range(3)]
    sent = [parts[0], parts[1], [parts[2][0] * factor]]  # the third sends other
    summed = [sum(p[0] for p in sent)]
    *declared, total = sk.sketch(SEED, *parts, summed)
    assert not sk.adds_up([sk.finite(d) for d in declared], sk.finite(total), 1e-5)


def test_the_directions_depend_on_the_seed_and_a_nan_part_matches_only_nan():
    x = [torch.randn(100)]
    assert sk.sketch(SEED, x) != sk.sketch("cd" * 32, x)
    nan = sk.finite(sk.sketch(SEED, [torch.full((100,), float("nan"))])[0])
    assert nan == (None,) * sk.ROWS
    assert sk.mismatch(nan, nan) == 0.0
    assert sk.mismatch(nan, sk.finite(sk.sketch(SEED, x)[0])) == float("inf")
    assert not sk.adds_up([nan], nan, 1e-4)


def test_the_seed_is_the_hash_of_the_sums_bytes():
    a = [torch.ones(3), torch.zeros(2, dtype=torch.bfloat16)]
    assert sk.sum_seed(a) == sk.sum_seed([t.clone() for t in a])
    assert sk.sum_seed(a) != sk.sum_seed([torch.ones(3) * 2, a[1]])


# -- the declarations, over a real gloo group (one thread per member) ------------------


@pytest.fixture
def store_port():
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10), use_libuv=True)
    yield master.port
    del master


EXCHANGE = GradientExchange([torch.nn.Parameter(torch.zeros(8))], groups=1)


def _group(port: int, rank: int, world: int, epoch: int = 0) -> EpochGroup:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=10), use_libuv=True)
    return EpochGroup.build(store, epoch, rank, world, backend="gloo", timeout_s=10.0,
                            poll_s=0.05, should_cancel=lambda: False)


def _tail(rank: int, world: int, lr: float = 0.1, loss: float = 2.0,
          samples: float = 4.0) -> tuple[float, ...]:
    tail = [0.0] * (1 + 3 + 2 * world)
    tail[0], tail[1], tail[2], tail[3] = lr, 1.0, loss, samples  # lr, ran, loss sum, samples
    tail[4 + 2 * rank] = float(rank + 1)  # its fingerprint slot
    return tuple(tail)


def _members(port: int, parts: list[list[torch.Tensor]], tails: list[tuple[float, ...]], *,
             sent: list[list[torch.Tensor]] | None = None, counts: list[int] | None = None,
             expected: int = 0, summed_tail: tuple[float, ...] | None = None,
             member=None, epoch: int = 0) -> list:
    """Every member checks at once; `sent`: what each really put in the sum (default:
    what it declares); `member(rank, group, sent)`: what a rank does instead of checking
    (if it returns True); `epoch`: a new one for each group built on the same store."""
    world = len(parts)
    sent = sent or parts
    summed = [sum(p[i] for p in sent) for i in range(len(parts[0]))]
    summed_tail = summed_tail or tuple(sum(t[i] for t in tails) for i in range(len(tails[0])))
    out: list = [None] * world

    def run(rank: int) -> None:
        group = _group(port, rank, world, epoch)
        counting = {} if counts is None else {
            "count": counts[rank], "summed_count": sum(counts), "round_expected": expected}
        mine = Sent(mine=parts[rank], summed=summed, tail=tails[rank], summed_tail=summed_tail,
                    **counting)
        if member is not None and member(rank, group, mine):
            return
        check = SentCheck(EXCHANGE.declared_lrs, EXCHANGE.declared_loss)
        out[rank] = check.check(group, mine, lambda: False)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _parts(world: int) -> list[list[torch.Tensor]]:
    torch.manual_seed(2)
    return [[torch.randn(64)] for _ in range(world)]


def test_honest_members_pass_and_each_record_carries_every_members_sketch(store_port):
    parts = _parts(3)
    out = _members(store_port, parts, [_tail(r, 3) for r in range(3)])
    assert all(o.ok and o.refusal == "" for o in out)
    assert len({o.exchanged for o in out}) == 1  # every member was told the same
    exchanged = out[0].exchanged
    assert exchanged.counts is None
    assert exchanged.losses == (2.0, 2.0, 2.0) and exchanged.loss_samples == (4, 4, 4)
    for declared, part in zip(exchanged.sketches, parts):
        assert sk.mismatch(declared, sk.finite(sk.sketch(exchanged.seed, part)[0])) < 1e-6


def test_a_member_that_sent_other_than_it_declares_makes_every_member_refuse(store_port):
    parts = _parts(3)
    sent = [parts[0], parts[1], [parts[2][0] * 10]]
    out = _members(store_port, parts, [_tail(r, 3) for r in range(3)], sent=sent)
    assert all(o.ok and "sketches do not add up" in o.refusal for o in out)


def test_a_member_that_tells_its_peers_different_things_is_refused_by_one(store_port):
    """It sent ×10 and tells rank 1 the truth (so rank 1's sums add up) and rank 0 the
    sketch of its committed part: rank 0 refuses, which refuses the step everywhere."""
    parts = _parts(3)
    sent = [parts[0], parts[1], [parts[2][0] * 10]]
    summed = [sum(p[0] for p in sent)]
    seed = sk.sum_seed(summed)
    honest, really = sk.sketch(seed, parts[2], sent[2])
    tails = [_tail(r, 3) for r in range(3)]

    def equivocate(rank, group, mine):
        if rank != 2:
            return False
        rows = torch.tensor([[*honest, *tails[2], float("nan")],
                             [*really, *tails[2], float("nan")],
                             [*really, *tails[2], float("nan")]], dtype=torch.float64)
        group._run([group.pg.alltoall_base(torch.empty_like(rows), rows, [], [],
                                           dist.AllToAllOptions())], [rows], lambda: False, "")
        return True

    out = _members(store_port, parts, tails, sent=sent, member=equivocate)
    assert "sketches do not add up" in out[0].refusal and out[1].refusal == ""


def test_a_learning_rate_other_than_its_peers_is_refused(store_port):
    """Learning rates are summed in the same all-reduce: 10x one member's would scale
    everyone's update by a third more or so."""
    tails = [_tail(0, 3), _tail(1, 3), _tail(2, 3, lr=1.0)]
    out = _members(store_port, _parts(3), tails)
    assert all("different learning rates" in o.refusal for o in out)


def test_a_learning_rate_added_by_a_member_that_says_it_did_not_run_is_refused(store_port):
    """The mean lr divides by the members that ran: an lr from one that did not would
    raise it for everyone."""
    sneaky = list(_tail(2, 3))
    sneaky[1] = 0.0  # "did not run", yet its lr is in the sum
    out = _members(store_port, _parts(3), [_tail(0, 3), _tail(1, 3), tuple(sneaky)])
    assert all("different learning rates" in o.refusal for o in out)


def test_step_scalars_added_other_than_declared_are_refused(store_port):
    tails = [_tail(0, 2), _tail(1, 2)]
    real = tuple(a + b for a, b in zip(*tails))
    out = _members(store_port, _parts(2), tails, summed_tail=(real[0] * 5, *real[1:]))
    assert all("step scalars do not add up" in o.refusal for o in out)


def test_a_loss_report_over_a_negative_or_fractional_count_is_refused(store_port):
    """The guard's mean loss is the reports' sum over their samples': a negative count
    (which adds up like any scalar) would scale it. The loss itself is left to the audit."""
    for samples in (-4.0, 2.5):
        tails = [_tail(0, 2), _tail(1, 2, loss=-50.0, samples=samples)]
        out = _members(store_port, _parts(2), tails, epoch=1 if samples == 2.5 else 0)
        assert all("no whole number of samples" in o.refusal for o in out), out
        assert out[0].exchanged.loss_samples == (4, -1)


def test_a_stalled_member_ends_the_wait_when_membership_changes(store_port):
    polls, outcome, done = [], [], threading.Event()

    def stalled(rank, group, mine):
        if rank == 1:
            done.wait(30)  # alive (its connections open) but never declares
            return True
        outcome.append(SentCheck(EXCHANGE.declared_lrs, EXCHANGE.declared_loss).check(
            group, mine, lambda: polls.append(1) or len(polls) > 2))
        done.set()
        return True

    _members(store_port, _parts(2), [_tail(r, 2) for r in range(2)], member=stalled)
    assert len(polls) == 3 and outcome[0].ok is False


def test_diloco_counts_must_add_up_and_stay_inside_the_round(store_port):
    parts, tails = _parts(3), [_tail(r, 3) for r in range(3)]
    honest = _members(store_port, parts, tails, counts=[8, 8, 8], expected=24)
    assert all(o.refusal == "" for o in honest) and honest[0].exchanged.counts == (8, 8, 8)
    negative = _members(store_port, parts, tails, counts=[8, 8, -16], expected=24, epoch=1)
    assert all("outside the round" in o.refusal for o in negative)
    too_many = _members(store_port, parts, tails, counts=[8, 8, 25], expected=24, epoch=2)
    assert all("outside the round" in o.refusal for o in too_many)
