"""DiLoCo's mechanics in one process (a group of one): the outer step is SGD with
Nesterov momentum on the pseudo-gradient, a discarded outer step leaves the
replica where it was, a joiner continues from theta_outer, and samples lost
with a member's inner work are counted."""

from __future__ import annotations

import copy

import torch

from shoal.spec.job import SyncSpec
from shoal.train.sync.diloco import DiLoCo
from shoal.train.sync.exchange import GradientExchange
from shoal.train.sync.every_step import EveryStep
from shoal.train.sync.modes import make_sync
from shoal.train.sync.protocol import StepWork
from tests.train.sync.test_codecs import Alone

SPEC = SyncSpec(mode="diloco", inner_steps=3, outer_lr=0.7, outer_momentum=0.9)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)


def _loss(model: torch.nn.Module, step: int) -> torch.Tensor:
    x, y = _batch(step)
    return ((model(x) - y) ** 2).mean()


class Worker:
    """The run's side of DiLoCo, reduced to what it calls."""

    def __init__(self, spec: SyncSpec = SPEC) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 3)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.exchange = GradientExchange(list(self.model.parameters()), groups=1)
        self.sync = make_sync(spec, self.exchange, self.optimizer)
        self.group = Alone()

    def inner_step(self) -> None:
        self.exchange.install()
        self.optimizer.step()

    def step(self, step: int, share: int = 8, global_batch: int = 8, apply: bool = True) -> None:
        """`apply`: the step's verdict (the vote's at an outer step, this worker's own
        guard's at an inner step)."""
        _loss(self.model, step).backward()
        self.exchange.fold(share / global_batch)
        work = StepWork(step, share, (share,), global_batch)
        if not self.sync.votes(step):
            self.sync.step_alone(work, self.inner_step, applied=apply)
        else:
            self.sync.exchange_step(self.group, lambda: False, work, self.inner_step)
            if apply:
                self.sync.apply(self.inner_step)
            else:
                self.sync.skip()
        self.exchange.clear()


def test_outer_step_is_nesterov_sgd_on_the_pseudo_gradient():
    worker = Worker()
    assert isinstance(worker.sync, DiLoCo)
    reference = copy.deepcopy(worker.model)
    outer = [p.detach().clone().requires_grad_() for p in reference.parameters()]
    outer_opt = torch.optim.SGD(outer, lr=0.7, momentum=0.9, nesterov=True)
    inner_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(9):
        worker.step(step)
        inner_opt.zero_grad()
        _loss(reference, step).backward()
        inner_opt.step()
        if (step + 1) % 3 == 0:
            for o, p in zip(outer, reference.parameters()):
                o.grad = o.detach() - p.detach()
            outer_opt.step()
            with torch.no_grad():
                for o, p in zip(outer, reference.parameters()):
                    p.copy_(o)
            assert worker.sync.consensus
        else:
            assert not worker.sync.consensus
    for got, want in zip(worker.model.parameters(), reference.parameters()):
        assert torch.allclose(got, want, atol=1e-6)


def test_discarded_outer_step_puts_the_replica_back():
    worker = Worker()
    worker.step(0)
    worker.step(1)
    before = [p.detach().clone() for p in worker.model.parameters()]
    outer = worker.sync.outer.clone()
    worker.step(2, apply=False)  # the outer step's exchange ran, then the step was discarded
    assert all(torch.equal(a, b) for a, b in zip(before, worker.model.parameters()))
    assert torch.equal(outer, worker.sync.outer)
    assert worker.sync.round_expected == 16  # the round goes on: the step is redone
    worker.step(2)
    assert worker.sync.consensus and not torch.equal(outer, worker.sync.outer)


def test_joiner_continues_from_theta_outer():
    sender, joiner = Worker(), Worker()
    for step in range(4):  # one outer step, then one inner step of the next round
        sender.step(step)
    state = sender.sync.state_dict()
    joiner.sync.load_state_dict(copy.deepcopy(state))
    flat = torch.cat([p.detach().reshape(-1) for p in joiner.model.parameters()])
    assert torch.equal(flat, sender.sync.outer)
    assert joiner.sync.fingerprint() == sender.sync.fingerprint()  # what every step compares
    assert not joiner.sync.consensus  # the sender's model has moved on from theta_outer
    assert joiner.sync.round_samples == 0 and joiner.sync.round_expected == 8


def test_samples_of_a_lost_member_are_counted_as_dropped():
    worker = Worker()
    worker.step(0, share=4, global_batch=8)  # two members; the other one's half ...
    worker.step(1, share=4, global_batch=8)
    worker.step(2, share=8, global_batch=8)  # ... is lost with it before the outer step
    assert worker.sync.samples_dropped == 8
    worker.step(3)
    assert worker.sync.samples_dropped == 0


def test_every_step_sync_with_no_codec_is_one_all_reduce_of_the_buffers():
    worker = Worker(SyncSpec())
    assert isinstance(worker.sync, EveryStep) and worker.sync.codec is None
    seen = []

    class Recording(Alone):
        def all_reduce(self, tensors, should_cancel):
            seen.append(list(tensors))

    _loss(worker.model, 0).backward()
    worker.exchange.fold(1.0)
    worker.sync.exchange_step(Recording(), lambda: False, StepWork(0, 8, (8,), 8), worker.inner_step)
    assert len(seen) == 1 and all(a is b for a, b in zip(seen[0], worker.exchange.tensors()))


def test_an_inner_step_refused_by_its_own_guard_still_counts_in_the_round():
    worker = Worker()
    worker.step(0)
    worker.step(1, apply=False)  # this worker's own guard refused it: not in its delta
    assert (worker.sync.round_samples, worker.sync.round_expected) == (8, 16)
    worker.step(2)  # the outer step: 16 of 24 samples behind the average, 8 dropped
    assert worker.sync.samples_dropped == 8 and worker.sync.consensus


def test_only_the_outer_step_is_voted_on():
    worker = Worker()
    assert [s for s in range(7) if worker.sync.votes(s)] == [2, 5]
    assert worker.sync.steps_per_vote == 3
    assert all(Worker(SyncSpec()).sync.votes(s) for s in range(3))
