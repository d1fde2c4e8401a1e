"""What every codec shares: error feedback, the group it exchanges through, and
a count of the bytes it puts on the wire.

A codec turns each member's contribution into something smaller, exchanges
that through the group and gives every replica the same sum of what all
members sent (decoded in rank order, so the bits agree everywhere). What a
member did not send (its contribution minus its own decoded message) is its
residual, added to its next contribution (Seide et al. 2014, Karimireddy et
al. 2019), so over steps nothing is lost, only delayed. A residual is
staged until the step commits; a discarded step leaves the old one in place.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

log = logging.getLogger(__name__)

ShouldCancel = Callable[[], bool]


class Collectives(Protocol):
    """The part of an EpochGroup a codec uses (a fake one in tests)."""

    world: int

    def all_reduce(self, tensors: list[torch.Tensor], should_cancel: ShouldCancel) -> None: ...

    def all_gather(self, tensors: list[torch.Tensor],
                   should_cancel: ShouldCancel) -> list[list[torch.Tensor]]: ...


def ring_all_reduce_bytes(nbytes: int, world: int) -> int:
    """Bytes one member sends in a ring all-reduce of `nbytes`: 2 (n-1)/n of them."""
    return 2 * (world - 1) * nbytes // world if world > 1 else 0


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Tensors as one uint8 vector (their bytes in order), to send in one collective."""
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def unpack(packed: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`pack`'s tensors back from a member's buffer, shaped and typed as `like` (every
    member's messages have the same shapes: the codecs' sizes depend on the model only)."""
    out, at = [], 0
    for t in like:
        size = t.numel() * t.element_size()
        # A copy: a view must start at a multiple of its dtype's size.
        out.append(packed[at:at + size].clone().view(t.dtype).view(t.shape))
        at += size
    if at != packed.numel():
        raise ValueError(f"a packed message of {packed.numel()} bytes for {at}")
    return out


def ring_all_gather_bytes(nbytes: int, world: int) -> int:
    """Bytes one member sends in a ring all-gather of its `nbytes`: n-1 copies' worth."""
    return (world - 1) * nbytes if world > 1 else 0


class Codec(ABC):
    """Compressed exchange of a flat float32 vector, with error feedback.

    `shapes`: the parameter shapes the vector is cut into, in order (PowerSGD
    needs matrices; the others read the vector whole)."""

    name = "codec"

    def __init__(self, shapes: Sequence[torch.Size]) -> None:
        self.shapes = [torch.Size(s) for s in shapes]
        self.numel = sum(s.numel() for s in self.shapes)
        self.residual: torch.Tensor | None = None  # what was not sent yet
        self._staged: torch.Tensor | None = None  # this step's new residual, until it commits
        self.bytes_sent = 0  # on the wire by this member (ring model), all attempts

    def exchange(self, contribution: torch.Tensor, group: Collectives,
                 should_cancel: ShouldCancel) -> torch.Tensor:
        """Every member's decoded message, summed (the same bits on every replica)."""
        with torch.no_grad():
            corrected = self._corrected(contribution)
            total, mine = self._exchange(corrected, group, should_cancel)
            self._staged = corrected - mine
        return total

    def _corrected(self, contribution: torch.Tensor) -> torch.Tensor:
        """`contribution` plus what earlier steps did not send (a new tensor)."""
        if contribution.numel() != self.numel:
            raise ValueError(f"{self.name}: {contribution.numel()} values for {self.numel}")
        return contribution.float() + self.residual if self.residual is not None \
            else contribution.float().clone()

    def commit(self) -> None:
        """The step committed and was applied: what was not sent waits for the next one."""
        if self._staged is not None:
            self.residual, self._staged = self._staged, None

    def discard(self) -> None:
        """The step was discarded or not applied: keep the residual as it was."""
        self._staged = None

    def reset(self, reason: str) -> None:
        """Drop the residual (and any shared codec state): membership changed, so the
        members that held the rest of the sum are not the same any more."""
        if self.residual is not None and bool(self.residual.any()):
            log.info("%s: error-feedback residual (|r| = %.3g) dropped: %s", self.name,
                     float(self.residual.norm()), reason)
        self.residual, self._staged = None, None

    @abstractmethod
    def _exchange(self, corrected: torch.Tensor, group: Collectives,
                  should_cancel: ShouldCancel) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of every member's decoded message, this member's own decoded message)."""


class GatheredCodec(Codec):
    """A codec whose messages are all-gathered once and decoded in rank order, so its
    exchange can also run in the background (`start`, then `finish` with what the
    group gathered): DiLoCo with bounded staleness sends rounds that way."""

    def _exchange(self, corrected: torch.Tensor, group: Collectives,
                  should_cancel: ShouldCancel) -> tuple[torch.Tensor, torch.Tensor]:
        messages, mine = self._encode(corrected)
        self.bytes_sent += self.message_bytes(messages, group.world)
        return self._decode(group.all_gather(messages, should_cancel), corrected.numel()), mine

    def exchange_with(self, contribution: torch.Tensor, scalars: torch.Tensor,
                      group: Collectives, should_cancel: ShouldCancel
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """`exchange`, with float32 `scalars` summed beside it in the same all-gather:
        (every member's decoded message summed, the scalars summed in rank order). The
        messages and scalars travel as one buffer, since on a slow link each collective
        costs its round trips (bench/wan.py, 4 hosts 100 ms apart: ~0.9 s for a ring
        all-reduce of a few scalars, ~1 s for each all-gather)."""
        parts = [*self.start(contribution), scalars.float()]
        packed = pack(parts)
        self.bytes_sent += self.message_bytes([packed], group.world)
        (rows,) = group.all_gather([packed], should_cancel)
        per_rank = [unpack(row, parts) for row in rows]  # rank order
        summed = torch.zeros_like(parts[-1])
        for r in per_rank:
            summed += r[-1]
        return self.finish([[r[i] for r in per_rank] for i in range(len(parts) - 1)]), summed

    def start(self, contribution: torch.Tensor) -> list[torch.Tensor]:
        """This member's messages for `contribution` (plus the residual), to all-gather;
        the new residual is staged as in `exchange` (commit or discard it)."""
        with torch.no_grad():
            corrected = self._corrected(contribution)
            messages, mine = self._encode(corrected)
            self._staged = corrected - mine
        return messages

    def finish(self, gathered: list[list[torch.Tensor]]) -> torch.Tensor:
        """Every member's decoded message, summed, from what the group gathered."""
        return self._decode(gathered, self.numel)

    def message_bytes(self, messages: list[torch.Tensor], world: int) -> int:
        """What all-gathering `messages` puts on the wire for this member (ring model)."""
        return ring_all_gather_bytes(sum(m.nbytes for m in messages), world)

    @abstractmethod
    def _encode(self, corrected: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(the messages to all-gather, this member's own decoded message)."""

    @abstractmethod
    def _decode(self, gathered: list[list[torch.Tensor]], numel: int) -> torch.Tensor:
        """The sum of every member's decoded message: per message, one copy per rank."""
