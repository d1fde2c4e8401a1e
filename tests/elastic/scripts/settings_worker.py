"""A stand-in worker that writes the settings it was launched with (RUN_DIR/WORKER.json),
then ends the job."""

import json
from dataclasses import asdict

from finish_now import finish_now
from shoal.train.run_config import RunConfig

config = RunConfig.from_env()
(config.run_dir / f"{config.worker}.json").write_text(json.dumps(asdict(config.settings)))
finish_now(config)
