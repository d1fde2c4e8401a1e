"""DiLoCo (Douillard et al. 2023): H inner steps of the user's optimizer on this
worker's own shares, then an outer step: every member's pseudo-gradient
(theta_outer - theta_local), weighted by the samples behind it, averaged
(through a codec if the job has one) and applied to theta_outer by SGD with
Nesterov momentum. Everyone continues from the new theta_outer.

Inner steps cross no network: only the outer step is exchanged and voted on
(`votes`); an inner step is judged by the worker's own guard and taken at
once (`step_alone`). Over a link with a 100 ms round trip the scalar
all-reduce and the vote of every step cost several times an inner step's
compute (bench/wan.py). Replicas legitimately differ between outer steps,
so the fingerprint an outer step's vote carries is theta_outer's (the same
everywhere), and parameter hashes are taken only where the model is
theta_outer.

Faults, joins and leaves take effect at the outer step: survivors keep
their inner work; a member lost mid-round takes its inner work of the
round with it, and its shares of the steps after it died are computed by
nobody. The outer average is then taken over the members present (their
samples), and the samples the round committed but nobody present computed
on are counted as `samples_dropped`, logged and written to the step log
(the report sums them). A joiner waits for the round to end and starts
from theta_outer and the outer momentum; a worker with a spot notice keeps
computing to the outer step, so its round counts (a round longer than the
notice loses it).

With work records (`[proof]`), each step's record claims where this worker's
own step started and ended (`shoal.verify.work_records`), and the round's
last step commits the weighted pseudo-gradient sent (`RoundProof.outer`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from shoal.spec.job import SyncSpec
from shoal.train.sync.codecs import make_codec
from shoal.train.sync.codecs.base import GatheredCodec, ShouldCancel, ring_all_reduce_bytes
from shoal.train.errors import TrainError
from shoal.train.sync.exchange import GradientExchange
from shoal.train.fingerprint import fingerprint
from shoal.train.group import EpochGroup
from shoal.train.hashing import param_sha256
from shoal.train.sync.protocol import InnerStep, RoundProof, StepWork

log = logging.getLogger(__name__)


def outer_sgd_step(outer: torch.Tensor, momentum: torch.Tensor, delta: torch.Tensor,
                   spec: SyncSpec) -> None:
    """SGD with Nesterov momentum on theta_outer, in place (torch.optim.SGD's update)."""
    mu, lr = spec.outer_momentum, spec.outer_lr
    with torch.no_grad():
        momentum.mul_(mu).add_(delta)
        update = delta.add(momentum, alpha=mu) if mu > 0 else delta
        outer.sub_(update, alpha=lr)


class DiLoCo:
    # Bounded staleness (shoal.train.sync.staleness) reports these; here rounds apply at once.
    slt_seen: int | None = None
    rounds_late = rounds_dropped = 0
    local_steps = True  # inner steps are taken alone; the outer step ends a round

    def __init__(self, exchange: GradientExchange, optimizer: torch.optim.Optimizer,
                 spec: SyncSpec, exchange_delay_s: float = 0.0) -> None:
        self.params = exchange.params
        self.exchange_delay_s = exchange_delay_s  # benchmarks only: a slow link, emulated
        if any(p.dtype != torch.float32 for p in self.params):
            raise TrainError("sync.mode = 'diloco' needs float32 parameters (bf16 autocast "
                             "is fine: it keeps parameters in float32)")
        self.exchange, self.optimizer, self.spec = exchange, optimizer, spec
        self.codec = make_codec(spec, [p.shape for p in self.params])
        with torch.no_grad():
            self.outer = torch.cat([p.detach().reshape(-1) for p in self.params])  # theta_outer
        self.momentum = torch.zeros_like(self.outer)  # the outer optimizer's buffer
        self.round_expected = 0  # samples of the round's applied steps, every member's
        self.round_samples = 0  # of those, the ones this worker computed on
        self.last_step: int | None = None  # the run's last step closes a round too
        self.consensus = True  # the model holds theta_outer (the same on every replica)
        self.samples_dropped = 0  # at the outer step just applied (for the step log)
        self._plain_bytes = 0
        self._work: StepWork | None = None
        self._outer_now = False
        self._backup: tuple[torch.Tensor, dict] | None = None
        self._delta: torch.Tensor | None = None
        self._present = self._expected = self._count_sent = 0
        self._summed_sent = torch.zeros(0)
        self.proof: RoundProof | None = None  # set when the job records work (`record_work`)
        self._round_start: int | None = None  # None: the next step begins a round

    @property
    def bytes_sent(self) -> int:
        return self._plain_bytes + (self.codec.bytes_sent if self.codec is not None else 0)

    def round_begins_at(self, step: int) -> int:
        """The first step of the round `step` is in (it started from theta_outer)."""
        return self._round_start if self._round_start is not None else step

    def plan(self, steps: int) -> None:
        self.last_step = steps

    def is_outer(self, step: int) -> bool:
        return (step + 1) % self.spec.inner_steps == 0 or (
            self.last_step is not None and step + 1 >= self.last_step)

    def fingerprint(self) -> tuple[int, int]:
        return fingerprint(list(self._views(self.outer)))

    @property
    def steps_per_vote(self) -> int:
        return self.spec.inner_steps

    def votes(self, step: int) -> bool:
        """Only the outer step is exchanged and voted on."""
        return self.is_outer(step)

    def record_work(self, proof: RoundProof) -> None:
        """Each worker steps alone inside a round: its records claim its own steps.
        A codec's messages are not what a record commits to."""
        if self.codec is not None:
            raise TrainError("[proof] under DiLoCo needs [sync] slt = 0 and codec = 'none'")
        self.proof = proof

    def step_alone(self, work: StepWork, inner_step: InnerStep, applied: bool) -> None:
        """An inner step, judged by this worker's own guard: `applied` if it passed.
        The round counts the step's samples whatever this worker's guard said, so the
        round's expected samples stay the same on every member; this worker's own
        count grows only by what it applied."""
        self._work, self._outer_now = work, False
        self._round_start = self.round_begins_at(work.step)
        if applied and work.share > 0:
            self._step_on_own_share(work, inner_step)
        if self.proof is not None:
            self.proof.local_stepped(applied and work.share > 0)
        self.round_samples += work.share if applied else 0
        self.round_expected += work.global_batch
        self.consensus, self.samples_dropped = False, 0

    def agreed_sha256(self, model: torch.nn.Module) -> str | None:
        return param_sha256(model) if self.consensus else None  # only where it holds theta_outer

    @contextlib.contextmanager
    def agreed(self) -> Iterator[None]:
        """Inside the block the model holds theta_outer, what every replica agrees on (to
        evaluate it); this worker's own inner work of the round comes back after."""
        if self.consensus:
            yield
            return
        local = self._flat()
        self._load_flat(self.outer)
        try:
            yield
        finally:
            self._load_flat(local)

    def new_epoch(self, epoch: int) -> None:
        if self.codec is not None:
            self.codec.reset(f"membership epoch {epoch} formed")

    # -- one step --------------------------------------------------------------

    def exchange_step(self, group: EpochGroup, should_cancel: ShouldCancel, work: StepWork,
                      inner_step: InnerStep) -> None:
        """The outer step (the run takes inner steps with `step_alone`)."""
        self._work, self._outer_now = work, True
        # The round's last inner step is taken before the vote (the pseudo-gradient
        # needs it); a discarded or skipped step puts the backup back.
        self._backup = (self._flat().clone(), copy.deepcopy(self.optimizer.state_dict()))
        self._round_start = self.round_begins_at(work.step)
        if work.share > 0:
            self._step_on_own_share(work, inner_step)
        mine = self.round_samples + work.share
        expected = self.round_expected + work.global_batch
        delta = (self.outer - self._flat()) * (mine / expected)
        if self.proof is not None:
            self.proof.local_stepped(work.share > 0)
            delta = self.proof.outer(delta, mine, expected)
        time.sleep(self.exchange_delay_s)
        tail = self.exchange.scalar_tail()
        self._count_sent = self.proof.sent_count(mine) if self.proof is not None else mine
        scalars = torch.cat([tail, torch.tensor([float(self._count_sent)])])
        if isinstance(self.codec, GatheredCodec):  # one all-gather, the scalars in it
            summed, scalars = self.codec.exchange_with(delta, scalars, group, should_cancel)
        elif self.codec is not None:
            summed = self.codec.exchange(delta, group, should_cancel)
            group.all_reduce([scalars], should_cancel)
            self._plain_bytes += ring_all_reduce_bytes(scalars.nbytes, group.world)
        else:  # one all-reduce: on a slow link each costs its round trips
            sent = torch.cat([delta, scalars])
            group.all_reduce([sent], should_cancel)
            self._plain_bytes += ring_all_reduce_bytes(sent.nbytes, group.world)
            summed, scalars = sent[:delta.numel()], sent[delta.numel():]
        tail.copy_(scalars[:-1])
        self._summed_sent = summed
        self._present, self._expected = int(scalars[-1].item()), expected
        # Weighted by the samples of the members present, whoever is missing.
        self._delta = summed * (expected / self._present) if self._present else torch.zeros_like(delta)

    def summed_sent(self) -> list[torch.Tensor]:
        """After the outer exchange: the sum of every member's weighted pseudo-gradient."""
        return [self._summed_sent]

    def sent_counts(self) -> dict[str, int]:
        """The samples count this worker sent, their sum, and the round's samples."""
        return {"count": self._count_sent, "summed_count": self._present,
                "round_expected": self._expected}

    def checked(self) -> list[torch.Tensor]:
        extra = [self._delta] if self._outer_now and self._delta is not None else []
        return [*self.exchange.gradients(), *extra]

    def apply(self, inner_step: InnerStep) -> None:
        """The outer step committed with an `apply` verdict."""
        work = self._work
        if self.codec is not None:
            self.codec.commit()
        self._outer_step(self._delta)
        self.samples_dropped = max(0, self._expected - self._present)
        log.info("outer step at step %d: pseudo-gradient norm %.4g over %d of %d samples%s",
                 work.step, float(self._delta.norm()), self._present, self._expected,
                 f" ({self.samples_dropped} dropped with a lost member's inner work)"
                 if self.samples_dropped else "")
        self.round_samples = self.round_expected = 0
        self._backup = self._delta = None
        self._round_start = None

    def skip(self) -> None:
        if self._backup is not None:
            flat, optimizer_state = self._backup
            self._load_flat(flat)
            self.optimizer.load_state_dict(optimizer_state)
        for p in self.params:  # .grad may still view a buffer of the failed step
            p.grad = None
        if self.codec is not None:
            self.codec.discard()
        self._backup = self._delta = None
        self.samples_dropped = 0

    def rolled_back(self) -> None:
        """Every member rolled back: the round's local work goes, theta_outer stays."""
        self._load_flat(self.outer)
        self.round_samples, self.consensus = 0, self.round_expected == 0

    # -- state a joiner receives -------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"outer": self.outer.clone(), "momentum": self.momentum.clone(),
                "round_expected": self.round_expected, "round_start": self._round_start}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """From a peer (a joiner, a resync) or a checkpoint: continue from theta_outer;
        the sender's own inner work of the round stays the sender's."""
        if state is None:  # a checkpoint written without DiLoCo: its model is theta_outer
            self.outer.copy_(self._flat())
            self.momentum.zero_()
            self.round_expected = 0
        else:
            self.outer.copy_(state["outer"])
            self.momentum.copy_(state["momentum"])
            self.round_expected = int(state["round_expected"])
        self._load_flat(self.outer)
        self.round_samples, self.consensus = 0, self.round_expected == 0
        self._backup = self._delta = None
        # A joiner mid-round (the round's end redone without a lost member) is in the
        # sender's round; its work records say so.
        self._round_start = None if self.round_expected == 0 else (
            state.get("round_start") if state is not None else None)
        if self.codec is not None:
            self.codec.reset("state loaded")

    # -- helpers -------------------------------------------------------------------

    def _step_on_own_share(self, work: StepWork, inner_step: InnerStep) -> None:
        # The buffers hold share/global_batch of the mean local gradient: the inner
        # optimizer gets the mean gradient over this worker's own samples.
        for gradients in self.exchange.gradients():
            gradients.mul_(work.global_batch / work.share)
        inner_step()

    def _outer_step(self, delta: torch.Tensor) -> None:
        outer_sgd_step(self.outer, self.momentum, delta, self.spec)
        self._load_flat(self.outer)
        self.consensus = True

    def _flat(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1) for p in self.params])

    def _load_flat(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for p, view in zip(self.params, self._views(flat)):
                p.copy_(view.view_as(p))  # copies: parameters never alias theta_outer

    def _views(self, flat: torch.Tensor):
        at = 0
        for p in self.params:
            yield flat[at:at + p.numel()]
            at += p.numel()
