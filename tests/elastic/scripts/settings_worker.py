"""A stand-in worker that writes the settings it was launched with (RUN_DIR/WORKER.json),
then ends the job."""

import json
from dataclasses import asdict

from shoal.train.rendezvous import Rendezvous, connect
from shoal.train.run_config import RunConfig

config = RunConfig.from_env()
(config.run_dir / f"{config.worker}.json").write_text(json.dumps(asdict(config.settings)))
Rendezvous(connect(config.host, config.port)).mark_done({"param_sha256": "0" * 64})
