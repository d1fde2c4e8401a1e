"""DiLoCo with bounded staleness (`[sync] slt = k`): a round's pseudo-gradients are
summed in the background while the next rounds' inner steps run, and the average
is applied exactly k outer steps later, so one slow link stalls nobody.

Every replica applies round t's average at outer step t + k (the run's last step
applies whatever is left), never earlier even if it arrived: when is decided by
the step count alone, so theta_outer and the outer momentum stay bit-identical
everywhere. The staleness is corrected the way eager updates do (Kale et al.
2025; Liu et al., asynchronous local-SGD): a worker does not wait k rounds for its
own progress to count. It starts each round from theta_outer with its own
pseudo-gradients of the rounds still in flight applied in their place (the same
outer optimizer, on a copy); when a round's average arrives it replaces the
worker's own contribution in theta_outer. So each worker trains on a point at
most k rounds of *other* workers' progress behind, and nothing is applied twice.
Own progress in full, not its 1/n share of the sum: on the tiny GPT (3 workers,
H = 10, slt = 1) the final val loss was 3.20-3.25 with it, 3.34 with the 1/n share
and 3.56 with no correction (plain delay), against 3.16 at slt = 0.

With a codec (int8 or top-k, whose messages are one all-gather), a round is
encoded when it starts and decoded when it is due; its error-feedback residual
is kept once the outer step that started it is applied, like every-step's.

A membership change abandons every round in flight on every member (no partial
sum is ever applied); their samples are counted as `samples_dropped` and the
rounds as `rounds_dropped`. Nothing in flight travels to a joiner: it gets
theta_outer, the momentum and the outer step count, which all members share.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from shoal.spec.job import SyncSpec
from shoal.train.sync.codecs.base import ShouldCancel, ring_all_reduce_bytes
from shoal.train.sync.diloco import DiLoCo, outer_sgd_step
from shoal.train.sync.exchange import GradientExchange
from shoal.train.group import EpochGroup, Started
from shoal.train.hashing import param_sha256
from shoal.train.errors import TrainError
from shoal.train.sync.protocol import InnerStep, RoundProof, StepWork

log = logging.getLogger(__name__)


def rounds_due(started: Sequence[int], now: int, slt: int, last: bool) -> int:
    """How many of the oldest rounds in flight (the outer steps that started them,
    oldest first) are applied at outer step `now`: those started `slt` or more outer
    steps ago; at the run's last step, all of them."""
    if last:
        return len(started)
    return sum(1 for index in started if index + slt <= now)


ReadRound = Callable[[], tuple[torch.Tensor, int]]


@dataclass
class Round:
    """One round's exchange, from its outer step until its average is applied."""

    index: int  # the outer step that started it (the same count on every replica)
    expected: int  # samples the round committed, every member's
    own: torch.Tensor  # this worker's pseudo-gradient (start - local), unweighted
    started: Started  # the group's handle on its background exchange
    # Once the exchange is done: (every member's sample-weighted pseudo-gradient summed,
    # the samples of the members present).
    read: ReadRound
    started_at: float = 0.0  # time.monotonic() at its start
    summed: torch.Tensor | None = None  # `read()`, once it arrived
    present: int = 0

    def arrive(self) -> None:
        self.summed, self.present = self.read()


class StaleDiLoCo(DiLoCo):
    def __init__(self, exchange: GradientExchange, optimizer: torch.optim.Optimizer,
                 spec: SyncSpec, exchange_delay_s: float = 0.0) -> None:
        super().__init__(exchange, optimizer, spec, exchange_delay_s)
        self.slt = spec.slt
        self.start = self.outer.clone()  # where this worker's round began
        self.pending: list[Round] = []  # started and committed, not applied yet (oldest first)
        self.outer_index = 0  # outer steps the job has taken (the same on every replica)
        # For the step log, at the step just applied: the largest staleness of a round
        # applied there (outer steps), how many were late, how many were abandoned.
        self.slt_seen: int | None = None
        self.rounds_late = self.rounds_dropped = 0
        self._carried = (0, 0)  # (samples, rounds) abandoned since the last logged step
        self._started: Round | None = None
        self._due = 0  # rounds of `pending` (then the started one) arrived for this outer step

    # -- one step --------------------------------------------------------------

    def exchange_step(self, group: EpochGroup, should_cancel: ShouldCancel, work: StepWork,
                      inner_step: InnerStep) -> None:
        self._work, self._outer_now = work, True
        self._backup = (self._flat().clone(), copy.deepcopy(self.optimizer.state_dict()))
        if work.share > 0:
            self._step_on_own_share(work, inner_step)
        mine = self.round_samples + work.share
        expected = self.round_expected + work.global_batch
        own = self.start - self._flat()
        # Started first, in the same order on every member (on the group's background
        # lane: the inner steps' scalar all-reduces run beside it, not behind it).
        started, read = self._start_exchange(group, own * (mine / expected), mine, should_cancel)
        self._started = Round(self.outer_index, expected, own, started, read, time.monotonic())
        tail = self.exchange.scalar_tail()
        scalars = tail.clone()
        group.all_reduce([scalars], should_cancel)
        self._plain_bytes += ring_all_reduce_bytes(scalars.nbytes, group.world)
        tail.copy_(scalars)
        in_flight = [*self.pending, self._started]
        self._due = rounds_due([r.index for r in in_flight], self.outer_index, self.slt,
                               self._last(work.step))
        for r in in_flight[:self._due]:  # arrived long ago, unless a link is slower than k rounds
            group.wait_for(r.started, should_cancel)
            r.arrive()
            # Benchmarks only: the exchange emulated over a slow link ends this late.
            time.sleep(max(0.0, r.started_at + self.exchange_delay_s - time.monotonic()))

    def step_alone(self, work: StepWork, inner_step: InnerStep, applied: bool) -> None:
        super().step_alone(work, inner_step, applied)
        self._log_fields(0, None, 0)

    def record_work(self, proof: RoundProof) -> None:
        """A round applied k outer steps late is not what a record of its step claims."""
        raise TrainError("[proof] under DiLoCo needs [sync] slt = 0 and codec = 'none'")

    def _start_exchange(self, group: EpochGroup, weighted: torch.Tensor, mine: int,
                        should_cancel: ShouldCancel) -> tuple[Started, ReadRound]:
        """Begin summing every member's `weighted` pseudo-gradient and samples `mine` in
        the background: all-reduced whole, or all-gathered through the codec."""
        samples = torch.tensor([float(mine)])
        if self.codec is None:
            sent = torch.cat([weighted, samples])
            self._plain_bytes += ring_all_reduce_bytes(sent.nbytes, group.world)
            started = group.start_all_reduce(sent, should_cancel)
            return started, lambda: (sent[:-1], int(sent[-1].item()))
        messages = self.codec.start(weighted)
        self.codec.bytes_sent += self.codec.message_bytes([*messages, samples], group.world)
        started, gathered = group.start_all_gather([*messages, samples], should_cancel)
        return started, lambda: (self.codec.finish(gathered[:-1]),
                                 int(sum(t.item() for t in gathered[-1])))

    def checked(self) -> list[torch.Tensor]:
        arrived = [*self.pending, self._started][:self._due] if self._outer_now else []
        return [*self.exchange.gradients(), *(r.summed for r in arrived)]

    def apply(self, inner_step: InnerStep) -> None:
        if self.codec is not None:  # the round just started sent its part: the rest waits
            self.codec.commit()
        self.pending.append(self._started)
        arrived, self.pending = self.pending[:self._due], self.pending[self._due:]
        dropped, late = 0, 0
        for r in arrived:
            average = r.summed * (r.expected / r.present) if r.present else torch.zeros_like(r.own)
            outer_sgd_step(self.outer, self.momentum, average, self.spec)
            dropped += max(0, r.expected - r.present)
            late += self.outer_index > r.index
        seen = max((self.outer_index - r.index for r in arrived), default=None)
        log.info("outer step %d at step %d: %d round(s) applied (staleness %s), %d in flight%s",
                 self.outer_index, self._work.step, len(arrived), seen, len(self.pending),
                 f" ({dropped} samples dropped with a lost member's inner work)" if dropped else "")
        self.outer_index += 1
        self._restart()
        self.round_samples = self.round_expected = 0
        self._log_fields(dropped, seen, late)
        self._backup, self._started, self._due = None, None, 0

    def skip(self) -> None:
        """The step was discarded or not applied. At an outer step the round started
        goes on (the replica is put back and the round continues to the next outer
        step); the rounds that arrived for it are dropped: the guard may have refused
        their average."""
        super().skip()
        if self._outer_now and self._due:
            due = min(self._due, len(self.pending))
            self._abandon(self.pending[:due], "its outer step was not applied")
            self.pending = self.pending[due:]
        self._started, self._due = None, 0
        self.slt_seen, self.rounds_late, self.rounds_dropped = None, 0, 0  # carried to the next

    def rolled_back(self) -> None:
        self._load_flat(self.start)
        self.round_samples, self.consensus = 0, False

    def agreed_sha256(self, model: torch.nn.Module) -> str | None:
        """theta_outer's hash, as the model's parameters: the model itself holds it only
        at the run's end (each worker adds its own rounds in flight)."""
        with self.agreed():
            return param_sha256(model)

    def new_epoch(self, epoch: int) -> None:
        super().new_epoch(epoch)
        # Survivors keep this round's inner work: its pseudo-gradient stays measured
        # from `start`; the next round starts from theta_outer without the abandoned ones.
        self._abandon(self.pending, f"membership epoch {epoch} formed")
        self.pending = []

    # -- state a joiner receives -------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "outer_index": self.outer_index}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        super().load_state_dict(state)
        self._abandon(self.pending, "state loaded")
        self.pending, self._started, self._due = [], None, 0
        self.outer_index = int(state.get("outer_index", 0)) if state else 0
        self.start = self.outer.clone()

    # -- helpers -------------------------------------------------------------------

    def _restart(self) -> None:
        """The next round starts from theta_outer plus this worker's own pseudo-gradients
        of the rounds in flight, in order, as if each were the average (eager update)."""
        start, momentum = self.outer.clone(), self.momentum.clone()
        for r in self.pending:
            outer_sgd_step(start, momentum, r.own, self.spec)
        self.start = start
        self._load_flat(start)
        self.consensus = not self.pending

    def _abandon(self, rounds: list[Round], why: str) -> None:
        if not rounds:
            return
        samples = sum(r.expected for r in rounds)
        log.warning("%d round(s) in flight abandoned (%s): %d samples dropped",
                    len(rounds), why, samples)
        self._carried = (self._carried[0] + samples, self._carried[1] + len(rounds))

    def _log_fields(self, dropped: int, seen: int | None, late: int) -> None:
        samples, rounds = self._carried
        self.samples_dropped, self.rounds_dropped = dropped + samples, rounds
        self.slt_seen, self.rounds_late = seen, late
        self._carried = (0, 0)

    def _last(self, step: int) -> bool:
        return self.last_step is not None and step + 1 >= self.last_step
