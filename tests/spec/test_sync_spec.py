"""The job file's [sync] section: today's behaviour by default, the planner's names,
and refusals that say what to change."""

from __future__ import annotations

import pytest

from shoal.spec import SpecError, parse_job
from shoal.spec.plan import Codec, SyncMode


def _job(**values):
    return parse_job({"steps": 10, "global_batch": 4, **values}, source="job.toml")


def test_default_is_plain_every_step_all_reduce():
    sync = _job().sync
    assert (sync.mode, sync.inner_steps, sync.codec) == (SyncMode.allreduce, 1, Codec.none)
    assert _job().hyperparameters()["sync"]["mode"] == "allreduce"  # bound by work records


def test_diloco_with_a_codec():
    sync = _job(sync={"mode": "diloco", "inner_steps": 50, "codec": "powersgd",
                      "powersgd_rank": 2, "outer_lr": 0.5}).sync
    assert (sync.mode, sync.inner_steps, sync.codec, sync.powersgd_rank) == (
        SyncMode.diloco, 50, Codec.powersgd, 2)


@pytest.mark.parametrize("values, expected", [
    ({"sync": {"inner_steps": 5}}, "applies to mode = 'diloco' only"),
    ({"sync": {"mode": "diloco"}}, "needs inner_steps >= 2"),
    ({"sync": {"codec": "zip"}}, "'sync.codec' = 'zip'"),
    ({"sync": {"topk_fraction": 1.5}}, "'sync.topk_fraction' = 1.5"),
    ({"sync": {"outer_momentum": 1.0}}, "'sync.outer_momentum' = 1.0"),
    ({"sync": {"codec": "int8"}, "aggregation": "median"}, "use it with [sync] mode = 'allreduce'"),
])
def test_refusals_name_the_key(values, expected):
    with pytest.raises(SpecError) as caught:
        _job(**values)
    assert expected in str(caught.value)
