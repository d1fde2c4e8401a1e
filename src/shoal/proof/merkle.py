"""The Merkle tree over an epoch's work records, whose root is anchored on chain.

Leaves are `WorkRecord.leaf()` (prefixed 0x00), inner nodes hash 0x01 ||
left || right, and the root binds the leaf count (0x02), so no leaf passes
for a node, no proof passes for another position, and no two leaf lists
share a root.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from shoal.proof.errors import DuplicateRecord, EmptyTree, MixedRecords, ProofError
from shoal.spec.proof import WorkRecord

HASH_BYTES = 32
_NODE = b"\x01"
_ROOT = b"\x02"


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


def _seal(count: int, top: bytes) -> bytes:
    # With odd nodes promoted, a proof's shape alone does not fix the leaf count
    # (leaf 0 of 3 leaves and of 4 leaves take proofs of the same length), so a
    # proof could pass under a wrong count, or a last leaf under a wrong index.
    # Hashing the count into the root closes that.
    return hashlib.sha256(_ROOT + count.to_bytes(8, "big") + top).digest()


class MerkleTree:
    """A binary Merkle tree; an odd node at a level is promoted unchanged.

    Promoting instead of duplicating the last node keeps the leaf list
    [a, b, c] from sharing its root with [a, b, c, c].
    """

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if not leaves:
            raise EmptyTree()
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, bytes) or len(leaf) != HASH_BYTES:
                raise ProofError(f"leaf {i} is not a 32-byte hash; pass WorkRecord.leaf() values")
        self._levels: list[list[bytes]] = [list(leaves)]
        while len(self._levels[-1]) > 1:
            level = self._levels[-1]
            above = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                above.append(level[-1])
            self._levels.append(above)
        self.count = len(leaves)
        self.root = _seal(self.count, self._levels[-1][0])

    def proof(self, index: int) -> tuple[bytes, ...]:
        """The siblings from leaf `index` up to the top (none where a node is promoted)."""
        if not 0 <= index < self.count:
            raise ProofError(f"leaf index {index} is outside a tree of {self.count} leaves")
        siblings = []
        for level in self._levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):
                siblings.append(level[sibling])
            index //= 2
        return tuple(siblings)


def verify_proof(leaf: bytes, index: int, count: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Whether `leaf` is leaf `index` of a tree of `count` leaves with this `root`.

    The count fixes where nodes are promoted, so the proof must have exactly
    the length that position needs: a truncated or extended proof fails.
    """
    if not 0 <= index < count or len(leaf) != HASH_BYTES or len(root) != HASH_BYTES:
        return False
    current, width, used = leaf, count, 0
    while width > 1:
        if not (index == width - 1 and width % 2):  # a promoted node takes no sibling
            if used == len(proof) or len(proof[used]) != HASH_BYTES:
                return False
            sibling = proof[used]
            used += 1
            current = node_hash(sibling, current) if index % 2 else node_hash(current, sibling)
        index //= 2
        width = (width + 1) // 2
    return used == len(proof) and _seal(count, current) == root


def epoch_tree(records: Iterable[WorkRecord]) -> tuple[MerkleTree, list[WorkRecord]]:
    """The tree of one epoch's records, in canonical (step, worker) order.

    The order is canonical so that anyone holding the records rebuilds the
    anchored root, whatever order they arrived in.
    """
    ordered = sorted(records, key=lambda r: (r.step, r.worker, r.membership_epoch))
    if not ordered:
        raise EmptyTree()
    jobs = {r.job for r in ordered}
    if len(jobs) > 1:
        raise MixedRecords(f"records of several jobs {sorted(jobs)}; build one tree per job")
    for before, after in zip(ordered, ordered[1:]):
        if (before.step, before.worker) == (after.step, after.worker):
            raise DuplicateRecord(after.step, after.worker)
    return MerkleTree([r.leaf() for r in ordered]), ordered
