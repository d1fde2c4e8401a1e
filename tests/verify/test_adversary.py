"""Loading adversaries, and each built-in doing what its name says to a
contribution, without a job around it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shoal.cli.launch_options import parse_adversaries
from shoal import ShoalError
from shoal.verify.adversary import BUILT_IN, AdversaryContext, load_adversary
from shoal.train.errors import TrainError


def _ctx(step=3, memory=None):
    return AdversaryContext(worker="w1", step=step, rank=1, world=2, num_samples=100, params=[],
                            memory={} if memory is None else memory)


def test_honest_is_none_and_unknown_names_say_what_exists():
    assert load_adversary(None) is None and load_adversary("") is None
    with pytest.raises(TrainError, match="sign_flip"):
        load_adversary("flip_sign")
    with pytest.raises(TrainError, match="cannot be loaded"):
        load_adversary("no.such.module:cheat")


def test_a_users_callable_is_checked_for_shape():
    cheat = load_adversary("tests.verify.roles.cheats:drift")
    honest = [torch.ones(5)]
    out = cheat.contribution(honest, _ctx())
    assert out[0].shape == (5,) and not torch.equal(out[0], honest[0])


def test_built_ins_change_what_they_say():
    g = [torch.arange(1.0, 7.0)]
    ctx = _ctx()
    assert torch.equal(load_adversary("sign_flip").contribution(g, ctx)[0], -g[0])
    assert torch.equal(load_adversary("scale").contribution(g, ctx)[0], 10 * g[0])
    assert not load_adversary("zero").contribution(g, ctx)[0].any()
    noise = load_adversary("random").contribution(g, ctx)[0]
    assert torch.isclose(noise.norm(), g[0].norm()) and not torch.equal(noise, g[0])
    replay, memory = load_adversary("replay"), {}  # the run keeps one memory per worker
    assert replay.contribution(g, _ctx(3, memory)) is g  # honest on its first step
    assert torch.equal(replay.contribution([g[0] * 2], _ctx(4, memory))[0], g[0])
    ids = np.arange(10, 20)
    assert len(load_adversary("half_samples").samples(ids, ctx)) == 5
    assert not set(load_adversary("other_samples").samples(ids, ctx)) & set(ids)
    assert set(BUILT_IN) >= {"random", "zero", "scale", "sign_flip", "replay", "other_samples",
                             "half_samples", "bad_commitment", "copy"}


def test_the_flag_names_worker_and_adversary():
    assert parse_adversaries(["1=sign_flip", "3=mod:fn"]) == {1: "sign_flip", 3: "mod:fn"}
    for bad in ("sign_flip", "x=zero", "1="):
        with pytest.raises(ShoalError, match="WORKER=NAME"):
            parse_adversaries([bad])


def test_an_adversary_at_a_rate_cheats_on_that_share_of_steps_only():
    import torch

    from shoal.verify.adversary import AdversaryContext, load_adversary

    adversary = load_adversary("sign_flip@0.3")
    honest = [torch.ones(4)]
    cheated = []
    for step in range(1000):
        ctx = AdversaryContext(worker="w", step=step, rank=0, world=2, num_samples=10, params=[])
        out = adversary.contribution(honest, ctx)
        assert torch.equal(out[0], -honest[0] if adversary.cheats(step) else honest[0])
        cheated.append(adversary.cheats(step))
    assert 0.25 < sum(cheated) / len(cheated) < 0.35
    for bad in ("sign_flip@0", "sign_flip@1.5", "sign_flip@x"):
        with pytest.raises(TrainError):
            load_adversary(bad)


def test_a_worker_told_an_unknown_adversary_stops_at_join_and_names_the_built_ins():
    from pathlib import Path

    import shoal
    from shoal.train.run_config import RunConfig, RunSettings, WorkerOverrides

    settings = WorkerOverrides(adversary="flip_sign").over(RunSettings())
    told = RunConfig.launched("127.0.0.1:9", "w1", Path("/tmp/run"), False, settings)
    # Read back as the worker process reads it, and refused before it reaches the store.
    with pytest.raises(TrainError, match="unknown adversary 'flip_sign'.*sign_flip"):
        shoal.join(RunConfig.from_env(told.to_env()))
