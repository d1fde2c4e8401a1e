"""Attacks on the anchored Merkle tree: every forged membership proof fails,
and no change to a record keeps its epoch's root."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.proof import DuplicateRecord, EmptyTree, MerkleTree, MixedRecords, epoch_tree, verify_proof
from shoal.proof.merkle import node_hash
from tests.proof.factory import honest_epoch, record


def leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(b"\x00" + i.to_bytes(4, "big")).digest() for i in range(n)]


@pytest.mark.parametrize("n", range(1, 34))
def test_every_leaf_of_every_tree_proves_membership(n):
    tree = MerkleTree(leaves(n))
    for i, leaf in enumerate(leaves(n)):
        assert verify_proof(leaf, i, n, tree.proof(i), tree.root)


@pytest.mark.parametrize("n", range(1, 34))
def test_a_proof_for_one_position_passes_for_no_other(n):
    tree, ls = MerkleTree(leaves(n)), leaves(n)
    for i in range(n):
        proof = tree.proof(i)
        for j in range(n):
            if j != i:  # the attacker claims its record sits at another index
                assert not verify_proof(ls[i], j, n, proof, tree.root)
        for count in range(1, 2 * n + 2):
            if count != n:  # or that the epoch had more or fewer records
                assert not verify_proof(ls[i], i, count, proof, tree.root)


@pytest.mark.parametrize("n", range(2, 34))
def test_a_tampered_proof_fails(n):
    tree, ls = MerkleTree(leaves(n)), leaves(n)
    for i in range(n):
        proof = list(tree.proof(i))
        assert not verify_proof(ls[i], i, n, proof[:-1], tree.root)  # truncated
        assert not verify_proof(ls[i], i, n, proof + [ls[0]], tree.root)  # extended
        for k in range(len(proof)):
            swapped = proof.copy()
            swapped[k] = hashlib.sha256(proof[k]).digest()  # a sibling swapped for another hash
            assert not verify_proof(ls[i], i, n, swapped, tree.root)
        other = ls[(i + 1) % n]
        assert not verify_proof(other, i, n, proof, tree.root)  # another leaf on this proof


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13])
def test_an_inner_node_cannot_pass_for_a_leaf(n):
    ls = leaves(n)
    tree = MerkleTree(ls)
    inner = node_hash(ls[0], ls[1])  # the attacker holds a real node of the tree
    upper = MerkleTree([inner, *ls[2:]]).proof(0)  # and the real path above it
    for count in range(1, n + 1):
        for index in range(count):
            assert not verify_proof(inner, index, count, upper, tree.root)


@pytest.mark.parametrize("n", range(1, 20))
def test_duplicating_the_last_leaf_changes_the_root(n):
    ls = leaves(n)
    assert MerkleTree(ls).root != MerkleTree(ls + [ls[-1]]).root
    tree = MerkleTree(ls + [ls[-1]])
    # The duplicated leaf's proof in the longer tree does not prove it into the real one.
    assert not verify_proof(ls[-1], n, n + 1, tree.proof(n), MerkleTree(ls).root)


FIELDS = {
    "step": st.integers(0, 10**6), "worker": st.text(min_size=1, max_size=20),
    "positions_start": st.integers(0, 10**9), "positions_end": st.integers(0, 10**9),
    "seed": st.integers(0, 2**63), "global_batch": st.integers(1, 10**6),
    "contribution_norm": st.floats(0.0, 1e6, allow_nan=False),
    "contribution_sha256": st.binary(min_size=32, max_size=32).map(bytes.hex),
    "params_sha256": st.binary(min_size=32, max_size=32).map(bytes.hex),
    "micro_batch": st.none() | st.integers(1, 64), "rng_seed": st.integers(0, 2**63),
    "rank": st.integers(0, 64), "shares": st.lists(st.integers(0, 64), min_size=1).map(tuple),
    "hyper_sha256": st.binary(min_size=32, max_size=32).map(bytes.hex),
}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 11), st.sampled_from(sorted(FIELDS)), st.data())
def test_any_change_to_any_record_changes_the_root(which, field, data):
    records = honest_epoch(range(3))  # 12 records
    tree, ordered = epoch_tree(records)
    value = data.draw(FIELDS[field])
    target = ordered[which]
    if getattr(target, field) == value:
        return
    changed = target.model_copy(update={field: value})
    rest = [r for r in ordered if r is not target]
    if any((r.step, r.worker) == (changed.step, changed.worker) for r in rest):
        return  # the tree refuses the duplicate outright (tested below)
    assert epoch_tree([*rest, changed])[0].root != tree.root


def test_the_root_does_not_depend_on_arrival_order():
    records = honest_epoch(range(4))
    assert epoch_tree(records)[0].root == epoch_tree(list(reversed(records)))[0].root


def test_a_worker_cannot_put_two_records_for_one_step_under_a_root():
    records = honest_epoch(range(2))
    second = record(1, "w0", contribution_sha256="ab" * 32)  # hedging: two contributions
    with pytest.raises(DuplicateRecord, match="step 1 of worker 'w0'"):
        epoch_tree([*records, second])


def test_empty_trees_and_foreign_records_are_refused():
    with pytest.raises(EmptyTree):
        MerkleTree([])
    with pytest.raises(EmptyTree):
        epoch_tree([])
    with pytest.raises(MixedRecords):
        epoch_tree([record(0, "w0"), record(1, "w0", job="job-2")])


def test_records_prove_membership_of_their_epoch_root():
    tree, ordered = epoch_tree(honest_epoch(range(5), workers=3))
    for i, r in enumerate(ordered):
        assert verify_proof(r.leaf(), i, tree.count, tree.proof(i), tree.root)
    forged = ordered[2].model_copy(update={"contribution_norm": 0.5})  # revealed ≠ anchored
    assert not verify_proof(forged.leaf(), 2, tree.count, tree.proof(2), tree.root)
