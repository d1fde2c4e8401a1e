"""A stand-in worker that ends the job at once: it marks it done in the store."""

from shoal.train.rendezvous import Rendezvous, connect
from shoal.train.run_config import RunConfig

config = RunConfig.from_env()
Rendezvous(connect(config.host, config.port)).mark_done({"param_sha256": "0" * 64})
