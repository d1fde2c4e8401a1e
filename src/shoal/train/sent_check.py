"""After a voted step's exchange, with work records: every member declares
what it sent, and the step is refused unless the declarations add up to what
was exchanged (`shoal.spec.proof.Exchanged` says why).

Each member writes its declaration once, under its rank, in the rendezvous
store (compare-and-set: nobody can write in another's name after it, and a
name taken before it is refused), then reads everyone's. Nothing here is
decided by one member for the others: each member checks for itself and
votes, and one refusing member is enough to refuse the step (the guard's
skip). A declaration binds, besides the sketch of the member's contribution:
- its step scalars (learning rates, loss and sample counts, fingerprint
  slot): they are summed in the same all-reduce, and a member that added
  another learning rate than its peers could scale everyone's update;
- under DiLoCo, the samples its pseudo-gradient is weighted by: the outer
  average is normalised by their sum, so a made-up count would scale it.
The record of the step carries every member's sketch and count, which the
audit holds the replay to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pydantic
import torch

from shoal.spec.proof import Exchanged, SentDeclaration
from shoal.train import sketch as sk
from shoal.train.rendezvous import Rendezvous

# How far the sketches' sum may be from the sum's sketch, relative to their sizes: the
# all-reduce adds in another order and a sketch is 3e-7 from exact (shoal.train.sketch),
# while a cheat's difference shows at its own size.
RTOL = 1e-5


@dataclass(frozen=True)
class Sent:
    """One member's side of a voted step's exchange, as the check needs it."""

    mine: list[torch.Tensor]  # what this member committed to sending (its sketch)
    summed: list[torch.Tensor]  # the exchanged sum of every member's
    tail: tuple[float, ...]  # the step scalars this member added
    summed_tail: tuple[float, ...]
    count: int | None = None  # DiLoCo: the samples its pseudo-gradient is weighted by
    summed_count: int | None = None
    round_expected: int | None = None  # DiLoCo: no count can exceed the round's samples


@dataclass(frozen=True)
class Checked:
    ok: bool  # every member declared a successful exchange (False: the step fails)
    refusal: str = ""  # why the step must not be applied ("" if it may)
    exchanged: Exchanged | None = None  # for the step's work record


class SentCheck:
    def __init__(self, rdzv: Rendezvous, poll_s: float,
                 lrs_of: Callable[[tuple[float | None, ...]], tuple[float | None, ...] | None]
                 ) -> None:
        self.rdzv, self.poll_s, self.lrs_of = rdzv, poll_s, lrs_of

    def failed(self, epoch: int, step: int, rank: int) -> None:
        """This member's exchange failed: say so, so no peer waits for its declaration."""
        self.rdzv.declare_sent(epoch, step, rank, SentDeclaration(ok=False).model_dump_json())

    def check(self, epoch: int, step: int, rank: int, world: int, sent: Sent,
              cancelled: Callable[[], bool]) -> Checked:
        seed = sk.sum_seed(sent.summed)
        mine, total = sk.sketch(seed, sent.mine, sent.summed)
        own = SentDeclaration(ok=True, sketch=sk.finite(mine), tail=sk.finite(sent.tail),
                              count=sent.count).model_dump_json()
        stood = self.rdzv.declare_sent(epoch, step, rank, own)
        while not self.rdzv.wait_keys(self.rdzv.sent_keys(epoch, step, world), self.poll_s):
            if cancelled():  # a member is gone: the step is redone without it
                return Checked(ok=False)
            self.rdzv.check_failed()
        try:
            declared = [SentDeclaration.model_validate_json(v)
                        for v in self.rdzv.sent_declarations(epoch, step, world)]
        except pydantic.ValidationError:
            return Checked(ok=True, refusal="a member's declaration of what it sent is malformed")
        if not all(d.ok for d in declared):
            return Checked(ok=False)
        exchanged = Exchanged(seed=seed, sketches=tuple(d.sketch for d in declared),
                              counts=tuple(d.count or 0 for d in declared)
                              if sent.count is not None else None)
        return Checked(ok=True, refusal=self._refusal(stood == own, declared, total, sent),
                       exchanged=exchanged)

    def _refusal(self, mine_stood: bool, declared: list[SentDeclaration],
                 total: tuple[float, ...], sent: Sent) -> str:
        if not mine_stood:
            return "another member wrote a declaration under this member's rank"
        if not sk.adds_up([d.sketch for d in declared], sk.finite(total), RTOL):
            return "the declared sketches do not add up to the exchanged sum"
        tails = [d.tail for d in declared]
        if any(len(t) != len(sent.summed_tail) or None in t for t in tails) or \
                not _adds_up(tails, sent.summed_tail):
            return "the declared step scalars do not add up to the exchanged ones"
        lrs = {self.lrs_of(t) for t in tails} - {None}
        if len(lrs) > 1:
            return f"members declared different learning rates: {sorted(lrs)}"
        if sent.count is not None:
            counts = [d.count for d in declared]
            if any(c is None or not 0 <= c <= (sent.round_expected or 0) for c in counts):
                return f"a declared samples count is outside the round: {counts}"
            if sum(c or 0 for c in counts) != sent.summed_count:
                return "the declared samples counts do not add up to the exchanged one"
        return ""


def _adds_up(parts: list[tuple[float | None, ...]], total: tuple[float, ...]) -> bool:
    for i, value in enumerate(total):
        column = [float(p[i] or 0.0) for p in parts]
        if not math.isclose(math.fsum(column), value, rel_tol=RTOL,
                            abs_tol=RTOL * sum(map(abs, column)) + 1e-12):
            return False
    return True
