"""A worker reads back exactly the config its launcher wrote, and a setting that
does not parse stops the launch with a message naming it."""

from pathlib import Path

import pytest

from shoal.train.errors import TrainError
from shoal.train.run_config import RunConfig


def test_what_a_launcher_writes_a_worker_reads_back():
    config = RunConfig(worker="node-w3", host="10.0.0.2", port=29400, run_dir=Path("/tmp/run"),
                       poll_s=0.01, checkpoint_dir="/tmp/ckpt", checkpoint_interval=7,
                       identity={"job": "tiny", "seed": 1}, replica_check_interval=2,
                       rebalance_interval=0, slowdown=2.5, spare=True, spare_warmup=False,
                       adversary="sign_flip@0.3", inject="nan-loss@node-w3:step4")
    assert RunConfig.from_env(config.to_env()) == config


def test_a_launched_worker_gets_its_place_over_the_settings_it_inherits():
    inherited = {"SHOAL_WORKER": "someone", "SHOAL_RUN_DIR": "/elsewhere", "SHOAL_SLOWDOWN": "3",
                 "PATH": "/bin"}
    config = RunConfig.launched("127.0.0.1:5000", "w1", Path("/tmp/run"), False, inherited)
    assert (config.worker, config.host, config.port) == ("w1", "127.0.0.1", 5000)
    assert config.run_dir == Path("/tmp/run") and config.slowdown == 3.0 and not config.spare


def test_a_setting_that_does_not_parse_is_named():
    with pytest.raises(TrainError, match="SHOAL_CHECKPOINT_INTERVAL='often'"):
        RunConfig.launched("127.0.0.1:5000", "w0", Path("/tmp/run"), False,
                           {"SHOAL_CHECKPOINT_INTERVAL": "often"})
