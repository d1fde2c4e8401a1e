"""Records owed and filed, which pay follows: tried as the worker that would be
paid for work nobody can audit (withholding its records, alone or with every
other member, or replacing one with a claim the final lineage does not take)."""

from __future__ import annotations

from shoal.proof.dues import Dues, record_dues
from tests.proof.factory import GLOBAL_BATCH as B
from tests.proof.factory import honest_step, record

FOUR = {0: ("w0", "w1", "w2", "w3")}


def test_an_honest_job_owes_nothing_it_did_not_file():
    records = [r for s in range(10) for r in honest_step(s, [B // 4] * 4)]
    dues = record_dues(records, FOUR, range(10))
    assert dues == {f"w{i}": Dues(10, 10) for i in range(4)}
    assert all(d.pay_share(1000) == 1000 for d in dues.values())


def test_a_withheld_record_costs_its_share_of_pay():
    records = [r for s in range(10) for r in honest_step(s, [B // 4] * 4)
               if not (r.worker == "w2" and s in (3, 7))]
    dues = record_dues(records, FOUR, range(10))
    assert dues["w2"] == Dues(10, 8) and dues["w2"].missing == 2
    assert dues["w2"].pay_share(1000) == 800
    assert dues["w0"].pay_share(1000) == 1000


def test_a_worker_without_a_share_owes_no_record():
    """A batch smaller than the epoch leaves a member without samples: nothing to record."""
    records = [r for s in range(4) for r in honest_step(s, [3, 3, 2, 0]) if r.worker != "w3"]
    dues = record_dues(records, FOUR, range(4))
    assert "w3" not in dues and dues["w0"] == Dues(4, 4)


def test_steps_that_nobody_filed_are_owed_by_the_nearest_lineage():
    """Every member withholding a step together still owes it; so does a lone worker
    that files nothing at all."""
    records = [r for s in range(10) if s not in (4, 5, 9)
               for r in honest_step(s, [B // 4] * 4)]
    dues = record_dues(records, FOUR, range(10))
    assert dues == {f"w{i}": Dues(10, 7) for i in range(4)}
    assert record_dues([], {0: ("w0",)}, range(6)) == {"w0": Dues(6, 0)}
    assert record_dues([], {}, range(6)) == {}


def test_members_owe_only_the_steps_of_their_lineage():
    """w4 joins for steps 5..9 (epoch 1): it owes those; w3 left at the change."""
    members = {0: ("w0", "w1", "w2", "w3"), 1: ("w0", "w1", "w2", "w4")}
    records = [r for s in range(5) for r in honest_step(s, [2, 2, 2, 2])]
    for s in range(5, 10):
        for r in honest_step(s, [2, 2, 2, 2]):
            worker = "w4" if r.worker == "w3" else r.worker
            records.append(r.model_copy(update={"worker": worker, "membership_epoch": 1}))
    dues = record_dues(records, members, range(10))
    assert dues["w3"] == Dues(5, 5) and dues["w4"] == Dues(5, 5) and dues["w0"] == Dues(10, 10)


def test_a_claim_the_final_lineage_does_not_take_costs_the_claimant_its_step():
    """The start-step attack (test_epochs): w1, a member of the later epoch 3, files its
    record of step 5 anew naming epoch 3, which replaces its record of epoch 2. The old
    lineage stays final, so w1's record of step 5 counts as withheld."""
    members = {2: ("w0", "w1", "w2", "w3"), 3: ("w0", "w1", "w2", "w3")}
    honest = [r.model_copy(update={"membership_epoch": 2}) for r in honest_step(5, [2] * 4)]
    fake = record(5, "w1", 5 * B, 6 * B, rank=1, shares=(0, B, 0, 0), membership_epoch=3,
                  params_sha256="f" * 64)
    kept = [r for r in honest if r.worker != "w1"] + [fake]
    dues = record_dues(kept, members, range(5, 6))
    assert dues["w1"] == Dues(1, 0) and dues["w1"].pay_share(1000) == 0
    assert dues["w0"] == Dues(1, 1)


def test_an_epoch_nobody_published_owes_nothing():
    records = honest_step(0, [B])
    assert record_dues(records, {}, range(1)) == {}
