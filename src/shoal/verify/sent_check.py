"""After a voted step's exchange, with work records: every member declares
what it sent, and the step is refused unless the declarations add up to what
was exchanged (`shoal.spec.proof.Exchanged` says why).

The declarations travel by an all-to-all on the epoch's group: gloo sends
each pair directly, so no member relays (and could alter) another's, and
nothing a member writes elsewhere (the rendezvous store takes anyone's
writes) can stand in for one. A member may still tell its peers different
things; each peer checks what it was told, so for a step to be applied every
honest member must have been told something that adds up. Nothing here is
decided by one member for the others: each checks for itself and votes, and
one refusing member is enough to refuse the step (the guard's skip). A
declaration binds, besides the sketch of the member's contribution:
- its step scalars (learning rates, loss and sample counts, fingerprint
  slot): they are summed in the same all-reduce, and a member that added
  another learning rate than its peers could scale everyone's update;
- under DiLoCo, the samples its pseudo-gradient is weighted by: the outer
  average is normalised by their sum, so a made-up count would scale it.
The step's record carries what this member was told (`Exchanged`), which
the audit holds the replay to: the sketch, the count, and the loss it
reported (the guard's spike check reads the mean loss, so a made-up one
could hide a spike or skip honest steps; it adds up like any scalar, and
only a replay of the member's samples tells it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shoal.spec.proof import Exchanged
from shoal.verify import sketch as sk
from shoal.train.group import EpochGroup, GroupCancelled, GroupFailed, ShouldCancel

# How far the sketches' sum may be from the sum's sketch, relative to their sizes: the
# all-reduce adds in another order and a sketch is 3e-7 from exact (shoal.verify.sketch),
# while a cheat's difference shows at its own size.
RTOL = 1e-5

LrsOf = Callable[[tuple[float, ...]], tuple[float, ...] | None]
LossOf = Callable[[tuple[float, ...]], tuple[float, float]]  # a tail's (loss sum, samples)

# Steps in a row this member refused before it gives the run up: a member that keeps
# sending other than it declares would otherwise hold the job at no progress while its
# skipped steps (each with a record) are still paid for. Honest runs refuse none.
MAX_REFUSED_IN_A_ROW = 10


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
class Declared:
    """What one member told this one (a row of the all-to-all)."""

    sketch: tuple[float, ...]
    tail: tuple[float, ...]
    count: float  # NaN when the step has no count (every-step sync)


@dataclass(frozen=True)
class Checked:
    ok: bool  # the declarations arrived (False: the group failed; the step fails)
    refusal: str = ""  # why the step must not be applied ("" if it may)
    exchanged: Exchanged | None = None  # for the step's work record


class SentCheck:
    def __init__(self, lrs_of: LrsOf, loss_of: LossOf) -> None:
        self.lrs_of, self.loss_of = lrs_of, loss_of
        self.refused_in_a_row = 0

    def hopeless(self, members: tuple[str, ...]) -> str | None:
        """Why the run should stop (too many steps in a row refused), or None."""
        if self.refused_in_a_row < MAX_REFUSED_IN_A_ROW:
            return None
        return (f"{self.refused_in_a_row} steps in a row were refused because what the "
                f"members declared they sent did not add up to what was exchanged: one of "
                f"{list(members)} sends other than it declares (see the workers' logs for "
                "the refusals). Take its provider out of the job and resume from the last "
                "checkpoint")

    def check(self, group: EpochGroup, sent: Sent, should_cancel: ShouldCancel) -> Checked:
        seed = sk.sum_seed(sent.summed)
        mine, total = sk.sketch(seed, sent.mine, sent.summed)
        count = math.nan if sent.count is None else float(sent.count)
        row = torch.tensor([*mine, *sent.tail, count], dtype=torch.float64)
        try:
            rows = group.exchange_rows(row, should_cancel)
        except (GroupFailed, GroupCancelled):
            return Checked(ok=False)
        size = len(mine)
        declared = [Declared(tuple(r[:size]), tuple(r[size:-1]), r[-1])
                    for r in rows.tolist()]
        counts = None if sent.count is None else tuple(
            int(d.count) if _whole(d.count) else -1 for d in declared)
        reports = [self.loss_of(d.tail) for d in declared]
        exchanged = Exchanged(seed=seed, sketches=tuple(sk.finite(d.sketch) for d in declared),
                              counts=counts,
                              losses=tuple(v if math.isfinite(v) else None for v, _ in reports),
                              loss_samples=tuple(int(n) if _whole(n) and n >= 0 else -1
                                                 for _, n in reports))
        refusal = self._refusal(declared, total, sent)
        self.refused_in_a_row = self.refused_in_a_row + 1 if refusal else 0
        return Checked(ok=True, refusal=refusal, exchanged=exchanged)

    def _refusal(self, declared: list[Declared], total: tuple[float, ...], sent: Sent) -> str:
        if not sk.adds_up([sk.finite(d.sketch) for d in declared], sk.finite(total), RTOL):
            return "the declared sketches do not add up to the exchanged sum"
        if not _adds_up([d.tail for d in declared], sent.summed_tail):
            return "the declared step scalars do not add up to the exchanged ones"
        lrs = {self.lrs_of(d.tail) for d in declared} - {None}
        if len(lrs) > 1:
            return f"members declared different learning rates: {sorted(lrs)}"
        covered = [self.loss_of(d.tail)[1] for d in declared]
        if not all(_whole(n) and n >= 0 for n in covered):
            # the mean loss is divided by their sum: a negative one would scale it
            return f"a declared loss report covers no whole number of samples: {covered}"
        if sent.count is not None:
            counts = [d.count for d in declared]
            if not all(_whole(c) and 0 <= c <= (sent.round_expected or 0) for c in counts):
                return f"a declared samples count is outside the round: {counts}"
            if sum(counts) != sent.summed_count:
                return "the declared samples counts do not add up to the exchanged one"
        return ""


def _whole(value: float) -> bool:
    return math.isfinite(value) and value == int(value)


def _adds_up(parts: list[tuple[float, ...]], total: tuple[float, ...]) -> bool:
    if any(len(p) != len(total) for p in parts):
        return False
    for i, value in enumerate(total):
        column = [p[i] for p in parts]
        if not all(map(math.isfinite, (*column, value))) or not math.isclose(
                math.fsum(column), value, rel_tol=RTOL,
                abs_tol=RTOL * sum(map(abs, column)) + 1e-12):
            return False
    return True
