"""Pluggable adversaries: what a cheating worker reports instead of its
honest work, so that users can rehearse their own defences.

`shoal train ... --adversary 1=NAME` makes worker 1 cheat: NAME is a
built-in below or `module:callable`, a function that receives the worker's
honest contribution (a list of tensors, one flat buffer per dtype), the
step and an `AdversaryContext`, and returns what the worker reports
instead. The built-ins use the same hook; a few also cheat elsewhere a
worker can (which samples it computes on, what it records, what it
reveals to an audit), through the other methods of `Adversary`.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shoal.spec.proof import WorkRecord
from shoal.train.errors import TrainError

Contribution = list[torch.Tensor]


@dataclass
class AdversaryContext:
    """What a cheat can see at a step."""

    worker: str
    step: int
    rank: int
    world: int
    num_samples: int  # the dataset's size (to pick samples other than the assigned ones)
    params: list[torch.Tensor]  # the model's trainable parameters (read only, please)
    memory: dict[str, Any] = field(default_factory=dict)  # kept across steps, per worker
    # The newest record another worker wrote (None when there is none yet).
    peer_record: Callable[[], WorkRecord | None] = lambda: None
    # Under DiLoCo, whether the step is the last of the worker's round (None: every-step).
    round_end: bool | None = None


class Adversary:
    """An honest worker; subclasses override where they cheat."""

    name = "honest"
    diloco_only = False  # cheats only under DiLoCo (honest under every-step sync)
    every_step_only = False  # a cheat audits catch only under every-step sync

    def samples(self, ids: np.ndarray, ctx: AdversaryContext) -> np.ndarray:
        """The sample ids the worker actually computes on (it records the assigned ones)."""
        return ids

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        """What the worker sends (and commits to) instead of `honest`."""
        return honest

    def record(self, record: WorkRecord, ctx: AdversaryContext) -> WorkRecord | None:
        """The record the worker publishes instead of the true one (None: it files none)."""
        return record

    def pseudo_gradient(self, honest: torch.Tensor, ctx: AdversaryContext) -> torch.Tensor:
        """Under DiLoCo, the (weighted) pseudo-gradient the worker sends at a round's end."""
        return honest

    def reveal(self, sent: Contribution, ctx: AdversaryContext) -> Contribution:
        """What the worker shows an audit instead of what it sent."""
        return sent

    # A cheat that commits one thing and puts another in the all-reduce, which shows
    # nobody its part (`shoal.verify.sent_check` is what stands in its way).
    declares_sent = True  # it declares the sketch of what it sent (False: of what it committed)

    def sent(self, committed: Contribution, ctx: AdversaryContext) -> Contribution:
        """What the worker puts in the exchange, having committed to `committed`."""
        return committed

    def sent_pseudo_gradient(self, committed: torch.Tensor, ctx: AdversaryContext) -> torch.Tensor:
        """Under DiLoCo: the pseudo-gradient it puts in the outer exchange."""
        return committed

    def sent_count(self, count: int, ctx: AdversaryContext) -> int:
        """Under DiLoCo: the samples count it sends beside its pseudo-gradient."""
        return count

    def reported_loss(self, loss_sum: float, ctx: AdversaryContext) -> float:
        """The loss sum it reports for the guard's spike check (its micro-batches'
        losses times their sizes)."""
        return loss_sum


class Scale(Adversary):
    """Scales its gradient (×-1 flips the sign): a push in a chosen direction."""

    def __init__(self, factor: float, name: str) -> None:
        self.factor, self.name = factor, name

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        return [t * self.factor for t in honest]


class Zero(Adversary):
    """Lazy: sends nothing, computes nothing it reports."""

    name = "zero"

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        return [torch.zeros_like(t) for t in honest]


class RandomGradient(Adversary):
    """Noise with the honest norm, so a norm screen alone cannot tell."""

    name = "random"

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        generator = torch.Generator().manual_seed(ctx.step * 7919 + ctx.rank)
        out = []
        for t in honest:
            noise = torch.randn(t.shape, generator=generator, dtype=torch.float32).to(t.dtype)
            out.append(noise * (t.float().norm() / noise.float().norm().clamp_min(1e-30)).to(t.dtype))
        return out


class Replay(Adversary):
    """Sends the gradient it computed at an earlier step (honest on the first)."""

    name = "replay"

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        earlier = ctx.memory.get("replay")
        ctx.memory.setdefault("replay", [t.clone() for t in honest])
        return earlier if earlier is not None else honest


class OtherSamples(Adversary):
    """Computes on samples of its choosing, not the assigned (recorded) ones."""

    name = "other_samples"

    def samples(self, ids: np.ndarray, ctx: AdversaryContext) -> np.ndarray:
        return (ids + 7919) % ctx.num_samples


class HalfSamples(Adversary):
    """Computes on half its share and doubles the result to pass for the whole."""

    name = "half_samples"

    def samples(self, ids: np.ndarray, ctx: AdversaryContext) -> np.ndarray:
        return ids[: max(1, len(ids) // 2)]

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        return [t * 2 for t in honest]


class BadCommitment(Adversary):
    """Commits to what it sent, then reveals something else to the audit."""

    name = "bad_commitment"

    def reveal(self, sent: Contribution, ctx: AdversaryContext) -> Contribution:
        return [t * 1.001 for t in sent]


class CopyRecord(Adversary):
    """Computes nothing and publishes another worker's record as its own."""

    name = "copy"

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        return [torch.zeros_like(t) for t in honest]

    def record(self, record: WorkRecord, ctx: AdversaryContext) -> WorkRecord:
        peer = ctx.peer_record()
        if peer is None:
            return record
        return record.model_copy(update={
            "positions_start": peer.positions_start, "positions_end": peer.positions_end,
            "contribution_sha256": peer.contribution_sha256,
            "contribution_norm": peer.contribution_norm})


class OuterScale(Adversary):
    """Under DiLoCo: honest inner steps, then a pseudo-gradient scaled ×10. The only
    value that reaches the shared model is the pseudo-gradient, so this is the cheat a
    poisoner would pick (every-step jobs: an honest worker)."""

    name = "outer_scale"
    diloco_only = True

    def pseudo_gradient(self, honest: torch.Tensor, ctx: AdversaryContext) -> torch.Tensor:
        return honest * 10.0


class InnerRandom(Adversary):
    """Under DiLoCo: noise with the honest norm for every inner step's gradient, and the
    honest gradient where a round ends. It applies and commits what it reports, so
    its chain of optimizer updates and its pseudo-gradient hold, and a replay of a
    round's end passes: the cheap lazy worker (or a poisoner steering its round
    through its inner steps) that only an audit of an inner step catches
    (every-step jobs: an honest worker)."""

    name = "inner_random"
    diloco_only = True

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        if ctx.round_end is None or ctx.round_end:
            return honest
        return RandomGradient().contribution(honest, ctx)


class HiddenScale(Adversary):
    """Commits its honest gradient (or pseudo-gradient) and puts it ×10 in the exchange,
    declaring what it sent: every audit replays the honest work and opens the honest
    commitment, so only the sketch of what it sent gives it away."""

    name = "hidden_scale"

    def sent(self, committed: Contribution, ctx: AdversaryContext) -> Contribution:
        return [t * 10.0 for t in committed]

    def sent_pseudo_gradient(self, committed: torch.Tensor, ctx: AdversaryContext) -> torch.Tensor:
        return committed * 10.0


class Unrecorded(Adversary):
    """Puts its gradient (under DiLoCo its round's pseudo-gradient) ×10 in the exchange
    and declares what it sent, so the sums add up and the step is applied, then files no
    record of any step: no commitment to open, only what its peers' records say it
    declared (`shoal.verify.audit.unrecorded`; under DiLoCo its round is replayed from the
    states it kept, `shoal.verify.audit.unrecorded_round`)."""

    name = "unrecorded"

    def sent(self, committed: Contribution, ctx: AdversaryContext) -> Contribution:
        return [t * 10.0 for t in committed]

    def sent_pseudo_gradient(self, committed: torch.Tensor, ctx: AdversaryContext) -> torch.Tensor:
        return committed * 10.0

    def record(self, record: WorkRecord, ctx: AdversaryContext) -> WorkRecord | None:
        return None


class _Callable(Adversary):
    """A user's `module:callable` (contribution, step, context) -> contribution."""

    def __init__(self, function: Callable[..., Contribution], name: str) -> None:
        self.function, self.name = function, name

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        out = self.function([t.clone() for t in honest], ctx.step, ctx)
        if (not isinstance(out, (list, tuple)) or len(out) != len(honest)
                or any(o.shape != h.shape for o, h in zip(out, honest))):
            raise TrainError(f"adversary {self.name} must return a list of {len(honest)} tensors "
                             "shaped like the contribution it received")
        return [o.to(h.dtype) for o, h in zip(out, honest)]


BUILT_IN: dict[str, Callable[[], Adversary]] = {
    "random": RandomGradient,
    "zero": Zero,
    "scale": lambda: Scale(10.0, "scale"),
    "sign_flip": lambda: Scale(-1.0, "sign_flip"),
    "sign_flip_scaled": lambda: Scale(-10.0, "sign_flip_scaled"),
    "replay": Replay,
    "other_samples": OtherSamples,
    "half_samples": HalfSamples,
    "bad_commitment": BadCommitment,
    "copy": CopyRecord,
    "outer_scale": OuterScale,
    "inner_random": InnerRandom,
    "hidden_scale": HiddenScale,
    "unrecorded": Unrecorded,
}
# Cheats only under DiLoCo (where a round ends, or on inner steps only): under
# every-step sync these workers are honest.
DILOCO_ONLY = frozenset(name for name, make in BUILT_IN.items() if make().diloco_only)
# Cheats that audits catch only under every-step sync (README, "Proof of learning").
EVERY_STEP_ONLY = frozenset(name for name, make in BUILT_IN.items() if make().every_step_only)


class Sometimes(Adversary):
    """Cheats (as `inner`) on a share `rate` of steps and is honest on the rest; which
    steps is fixed by a hash of the step, so no pattern tells a verifier when to look."""

    def __init__(self, inner: Adversary, rate: float) -> None:
        self.inner, self.rate = inner, rate
        self.name = f"{inner.name}@{rate:g}"
        self.diloco_only = inner.diloco_only
        self.every_step_only = inner.every_step_only
        self.declares_sent = inner.declares_sent

    def cheats(self, step: int) -> bool:
        digest = hashlib.sha256(f"shoal-sometimes:{self.name}:{step}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.rate

    def samples(self, ids: np.ndarray, ctx: AdversaryContext) -> np.ndarray:
        return self.inner.samples(ids, ctx) if self.cheats(ctx.step) else ids

    def contribution(self, honest: Contribution, ctx: AdversaryContext) -> Contribution:
        return self.inner.contribution(honest, ctx) if self.cheats(ctx.step) else honest

    def record(self, record: WorkRecord, ctx: AdversaryContext) -> WorkRecord | None:
        return self.inner.record(record, ctx) if self.cheats(ctx.step) else record

    def pseudo_gradient(self, honest: torch.Tensor, ctx: AdversaryContext) -> torch.Tensor:
        return self.inner.pseudo_gradient(honest, ctx) if self.cheats(ctx.step) else honest

    def sent(self, committed: Contribution, ctx: AdversaryContext) -> Contribution:
        return self.inner.sent(committed, ctx) if self.cheats(ctx.step) else committed

    def sent_pseudo_gradient(self, committed: torch.Tensor, ctx: AdversaryContext) -> torch.Tensor:
        return self.inner.sent_pseudo_gradient(committed, ctx) if self.cheats(ctx.step) else committed

    def sent_count(self, count: int, ctx: AdversaryContext) -> int:
        return self.inner.sent_count(count, ctx) if self.cheats(ctx.step) else count

    def reported_loss(self, loss_sum: float, ctx: AdversaryContext) -> float:
        return self.inner.reported_loss(loss_sum, ctx) if self.cheats(ctx.step) else loss_sum


def load_adversary(spec: str | None) -> Adversary | None:
    """A built-in NAME or `module:callable`, optionally `@RATE` (cheat on that share of
    steps, e.g. `sign_flip@0.3`); None for an honest worker."""
    if not spec:
        return None
    base, at, rate = spec.rpartition("@") if "@" in spec else (spec, "", "")
    if at:
        try:
            share = float(rate)
        except ValueError:
            share = -1.0
        if not 0.0 < share <= 1.0:
            raise TrainError(f"adversary {spec!r}: the rate after @ must be in (0, 1]")
        return Sometimes(load_adversary(base), share)
    if spec in BUILT_IN:
        return BUILT_IN[spec]()
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise TrainError(f"unknown adversary {spec!r}: use one of {', '.join(sorted(BUILT_IN))} "
                         "or module:callable")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise TrainError(f"adversary {spec!r} cannot be loaded: {error}") from None
    if isinstance(function, type) and issubclass(function, Adversary):
        return function()
    return _Callable(function, spec)
