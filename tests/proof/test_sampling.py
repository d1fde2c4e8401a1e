"""Attacks on audit sampling: a worker cannot learn or steer which of its
records are audited, every worker is audited, and anyone with the beacon
re-derives the same sample."""

from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.proof import ProofError, audit_sample, beacon, catch_probability, epoch_tree
from shoal.proof.sampling import audit_count
from tests.proof.factory import digest, honest_epoch, record

ROOT = hashlib.sha256(b"root").digest()


def keys(sample):
    return [(r.step, r.worker) for r in sample]


def test_anyone_with_the_beacon_derives_the_same_sample_in_any_order():
    records = honest_epoch(range(25))
    b = beacon(ROOT, b"block 1234")
    first = audit_sample(records, 0.05, 1, b)
    assert keys(first) == keys(audit_sample(list(reversed(records)), 0.05, 1, b))


def test_other_salts_pick_other_records():
    records = honest_epoch(range(25))
    samples = {tuple(keys(audit_sample(records, 0.05, 1, beacon(ROOT, f"block {i}".encode()))))
               for i in range(20)}
    assert len(samples) == 20


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 6), st.floats(0.0, 1.0), st.integers(0, 4),
       st.binary(min_size=1, max_size=8))
def test_every_worker_is_audited_and_the_rate_holds(steps, workers, rate, minimum, salt):
    records = honest_epoch(range(steps), workers=workers if 8 % workers == 0 else 1)
    sample = audit_sample(records, rate, minimum, beacon(ROOT, salt))
    assert len(sample) >= math.ceil(rate * len(records) - 1e-9)
    assert len(set(keys(sample))) == len(sample)  # no record twice
    per_worker = {r.worker: 0 for r in records}
    for r in sample:
        per_worker[r.worker] += 1
    owned = {w: sum(r.worker == w for r in records) for w in per_worker}
    assert all(per_worker[w] >= min(minimum, owned[w]) for w in per_worker)


def test_a_worker_with_one_record_among_many_is_still_audited():
    records = [*honest_epoch(range(100)), record(100, "rare")]
    assert "rare" in {r.worker for r in audit_sample(records, 0.01, 1, beacon(ROOT, b"x"))}


def test_grinding_a_record_before_the_beacon_is_known_buys_nothing():
    # The cheat tries many versions of its record and keeps the one that a beacon
    # it can compute (the root alone, or a guessed salt) would not audit. The
    # real salt is fixed after the anchor, so its odds are the honest ones.
    honest = honest_epoch(range(10), workers=4)
    guessed = beacon(ROOT, b"guess")
    kept = None
    for nonce in range(200):
        cheat = record(10, "cheat", rng_seed=nonce, contribution_sha256=digest(f"forged {nonce}"))
        if cheat.leaf() not in {r.leaf() for r in audit_sample([*honest, cheat], 0.1, 0, guessed)}:
            kept = cheat
            break
    assert kept is not None
    trials = 2000
    audited = sum(kept in audit_sample([*honest, kept], 0.1, 0, beacon(ROOT, i.to_bytes(4, "big")))
                  for i in range(trials))
    expected = audit_count(0.1, 41) / 41
    assert abs(audited / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_the_beacon_binds_the_root():
    tree, _ = epoch_tree(honest_epoch(range(3)))
    other, _ = epoch_tree(honest_epoch(range(4)))
    assert beacon(tree.root, b"s") != beacon(other.root, b"s")
    with pytest.raises(ProofError, match="empty salt"):
        beacon(tree.root, b"")  # a root alone is a beacon the workers can grind
    with pytest.raises(ProofError):
        audit_sample(honest_epoch(range(2)), 0.1, 1, b"short")


def test_catch_probability():
    assert catch_probability(0.0, 10) == 0.0
    assert catch_probability(1.0, 1) == 1.0
    assert catch_probability(0.5, 2) == pytest.approx(0.75)
    assert catch_probability(0.1, 0) == 0.0
    with pytest.raises(ProofError):
        catch_probability(1.5, 1)


def test_the_count_is_not_inflated_by_float_noise():
    assert audit_count(0.07, 100) == 7
    assert audit_count(0.021, 1000) == 21
    assert audit_count(1.0, 3) == 3


def test_under_diloco_each_workers_minimum_is_a_round_end_and_an_inner_step_of_it():
    """A cheat that poisons only its pseudo-gradients keeps every inner step honest, and
    one that fakes only its inner steps is honest where its rounds end: the audits a
    worker is sure to get land on a round's end and on an inner step of that round,
    whatever the beacon."""
    from shoal.spec.proof import LocalStep

    def local(r, outer):
        claim = LocalStep(round_start=r.step - r.step % 5, state_sha256=digest("s"), applied=True,
                          end_params_sha256=digest("e"), end_state_sha256=digest("f"),
                          **({"round_samples": 2, "round_expected": 8, "outer_norm": 1.0}
                             if outer else {}))
        return r.model_copy(update={"local": claim})

    records = [local(r, r.step % 5 == 4) for r in honest_epoch(range(20))]
    inner_steps_drawn = set()
    for i in range(30):
        sample = audit_sample(records, 0.0, 1, beacon(ROOT, f"block {i}".encode()))
        assert sorted(r.worker for r in sample) == ["w0", "w0", "w1", "w1", "w2", "w2", "w3",
                                                    "w3"]
        for worker in ("w0", "w1", "w2", "w3"):
            end, inner = sorted((r for r in sample if r.worker == worker),
                                key=lambda r: not r.local.outer)
            assert end.local.outer and not inner.local.outer
            assert inner.local.round_start == end.local.round_start
            inner_steps_drawn.add(inner.step % 5)
    assert inner_steps_drawn == {0, 1, 2, 3}  # which inner step is the beacon's


def test_under_diloco_a_round_end_whose_round_the_epoch_does_not_hold_brings_another_inner_step():
    """A round that began in the epoch before: its end's inner step is one of the worker's
    other rounds (every worker still has an inner step replayed)."""
    from shoal.spec.proof import LocalStep

    def local(r):
        start = 46 if r.step == 50 else r.step - (r.step - 51) % 5
        claim = LocalStep(round_start=start, state_sha256=digest("s"), applied=True,
                          end_params_sha256=digest("e"), end_state_sha256=digest("f"),
                          **({"round_samples": 2, "round_expected": 8, "outer_norm": 1.0}
                             if r.step in (50, 55, 60) else {}))
        return r.model_copy(update={"local": claim})

    # Step 50 ends a round begun at 46, in the epoch before; rounds 51-55 and 56-60 follow.
    records = [local(r) for r in honest_epoch(range(50, 61))]
    ends_without_their_round = 0
    for i in range(30):
        sample = audit_sample(records, 0.0, 1, beacon(ROOT, f"block {i}".encode()))
        for worker in ("w0", "w1", "w2", "w3"):
            end, inner = sorted((r for r in sample if r.worker == worker),
                                key=lambda r: not r.local.outer)
            assert end.local.outer and not inner.local.outer
            if end.step == 50:
                ends_without_their_round += 1
            else:
                assert inner.local.round_start == end.local.round_start
    assert ends_without_their_round > 0
