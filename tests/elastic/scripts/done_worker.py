"""A stand-in worker that ends the job at once: it marks it done in the store."""

import os

from shoal.train.rendezvous import Rendezvous, connect

host, _, port = os.environ["SHOAL_RENDEZVOUS"].rpartition(":")
Rendezvous(connect(host, int(port))).mark_done({"param_sha256": "0" * 64})
