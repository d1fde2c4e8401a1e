"""PowerSGD (Vogels, Karimireddy & Jaggi 2019): each weight matrix M (n x m) as a
rank-r product P Q^T, found by one step of power iteration warm-started from
the previous step's Q.

    P = M Q            all-reduced (summed) over the group, then orthonormalized
    Q = M^T P          all-reduced; the sum of every member's approximation is P Q^T

Vectors and matrices too small to gain (r (n + m) >= n m) travel uncompressed in
the first all-reduce. Q is shared by all members (it is all-reduced), so it is
reset to the same seeded start whenever membership changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shoal.train.sync.codecs.base import Codec, Collectives, ShouldCancel, ring_all_reduce_bytes

SEED = 20190530  # Q's start: the same on every member


def orthonormalize(p: torch.Tensor) -> None:
    """Gram-Schmidt on the columns of p (n x r), in place; a zero column stays zero.
    Column by column with plain reductions, so every replica gets the same bits."""
    for i in range(p.shape[1]):
        col = p[:, i]
        for j in range(i):
            col -= torch.dot(col, p[:, j]) * p[:, j]
        norm = torch.linalg.vector_norm(col)
        if norm > 0:
            col /= norm


class PowerSGDCodec(Codec):
    name = "powersgd"

    def __init__(self, shapes: Sequence[torch.Size], rank: int) -> None:
        super().__init__(shapes)
        self.rank = rank
        self._pieces: list[tuple[int, int, int, int]] = []  # (start, n, m, compressed?)
        start = 0
        for shape in self.shapes:
            n = shape[0] if len(shape) >= 2 else 1
            m = shape.numel() // n if n else 0
            compressed = len(shape) >= 2 and rank * (n + m) < n * m
            self._pieces.append((start, n, m, int(compressed)))
            start += shape.numel()
        self.q: list[torch.Tensor] = []  # (m, r) per compressed matrix: shared by all members
        self._next_q: list[torch.Tensor] | None = None  # this step's, until it commits
        self._start_q()

    def _start_q(self) -> None:
        generator = torch.Generator().manual_seed(SEED)
        self.q = [torch.randn(m, self.rank, generator=generator)
                  for _, n, m, c in self._pieces if c]

    def commit(self) -> None:
        super().commit()
        if self._next_q is not None:
            self.q, self._next_q = self._next_q, None

    def discard(self) -> None:
        super().discard()
        self._next_q = None

    def reset(self, reason: str) -> None:
        super().reset(reason)
        self._next_q = None
        self._start_q()

    def _exchange(self, corrected: torch.Tensor, group: Collectives,
                  should_cancel: ShouldCancel) -> tuple[torch.Tensor, torch.Tensor]:
        matrices = [corrected[s:s + n * m].view(n, m) for s, n, m, c in self._pieces if c]
        plain = [corrected[s:s + n * m] for s, n, m, c in self._pieces if not c]
        ps = [mat @ q for mat, q in zip(matrices, self.q)]  # (n, r) each
        first = torch.cat([p.reshape(-1) for p in ps] + plain)
        self.bytes_sent += ring_all_reduce_bytes(first.nbytes, group.world)
        group.all_reduce([first], should_cancel)
        p_sum, plain_sum = _split(first, [p.shape for p in ps]), first[sum(p.numel() for p in ps):]
        for p in p_sum:
            orthonormalize(p)
        qs = [mat.T @ p for mat, p in zip(matrices, p_sum)]  # (m, r): this member's own
        second = torch.cat([q.reshape(-1) for q in qs]) if qs else torch.zeros(0)
        mine = [p @ q.T for p, q in zip(p_sum, qs)]
        if qs:
            self.bytes_sent += ring_all_reduce_bytes(second.nbytes, group.world)
            group.all_reduce([second], should_cancel)
        q_sum = _split(second, [q.shape for q in qs])
        self._next_q = [q.clone() for q in q_sum]  # warm start of the next step
        total, own = torch.empty_like(corrected), corrected.clone()
        dense, plain_at = iter(zip(p_sum, q_sum, mine)), 0
        for s, n, m, c in self._pieces:
            if c:
                p, q, approx = next(dense)
                total[s:s + n * m] = (p @ q.T).reshape(-1)
                own[s:s + n * m] = approx.reshape(-1)
            else:  # sent whole: nothing of it is left over
                total[s:s + n * m] = plain_sum[plain_at:plain_at + n * m]
                plain_at += n * m
        return total, own


def _split(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    out, at = [], 0
    for shape in shapes:
        size = shape.numel()
        out.append(flat[at:at + size].view(shape))
        at += size
    return out
