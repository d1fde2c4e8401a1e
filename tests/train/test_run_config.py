"""A worker reads back exactly the config its launcher wrote, one worker's overrides
reach that worker alone, and a setting that does not parse stops the launch with a
message naming it."""

from pathlib import Path

import pytest

from shoal.train.errors import TrainError
from shoal.train.run_config import RunConfig, RunSettings, WorkerOverrides


def test_what_a_launcher_writes_a_worker_reads_back():
    settings = RunSettings(poll_s=0.01, checkpoint_dir="/tmp/ckpt", checkpoint_interval=7,
                           identity={"job": "tiny", "seed": 1}, replica_check_interval=2,
                           rebalance_interval=0, slowdown=2.5, spare_warmup=False,
                           adversary="sign_flip@0.3", inject="nan-loss@node-w3:step4")
    config = RunConfig(worker="node-w3", host="10.0.0.2", port=29400, run_dir=Path("/tmp/run"),
                       spare=True, settings=settings)
    assert RunConfig.from_env(config.to_env()) == config


def test_a_launched_worker_gets_its_place_over_the_settings_it_inherits():
    inherited = {"SHOAL_WORKER": "someone", "SHOAL_RUN_DIR": "/elsewhere", "SHOAL_SLOWDOWN": "3",
                 "PATH": "/bin"}
    config = RunConfig.launched("127.0.0.1:5000", "w1", Path("/tmp/run"), False,
                                RunSettings.from_env(inherited))
    assert (config.worker, config.host, config.port) == ("w1", "127.0.0.1", 5000)
    assert config.run_dir == Path("/tmp/run") and config.settings.slowdown == 3.0 and not config.spare


def test_a_setting_that_does_not_parse_is_named():
    with pytest.raises(TrainError, match="SHOAL_CHECKPOINT_INTERVAL='often'"):
        RunSettings.from_env({"SHOAL_CHECKPOINT_INTERVAL": "often"})


def test_one_workers_overrides_reach_that_worker_and_keep_the_rest_of_the_run():
    run = RunSettings(checkpoint_interval=7, inject="exchange-delay:0.1")
    cheat = WorkerOverrides(slowdown=4.0, adversary="sign_flip")
    config = RunConfig.launched("127.0.0.1:5000", "w1", Path("/tmp/run"), False, cheat.over(run))
    read = RunConfig.from_env(config.to_env()).settings
    assert (read.slowdown, read.adversary) == (4.0, "sign_flip")
    assert (read.checkpoint_interval, read.inject) == (7, "exchange-delay:0.1")
    assert WorkerOverrides().over(run) == run


def test_a_worker_slower_than_one_is_refused():
    with pytest.raises(TrainError, match="at least 1.0"):
        WorkerOverrides(slowdown=0.5)
