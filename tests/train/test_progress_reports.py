"""Reports nobody waits for (speed, the job's step count) leave the training
thread at once and reach the store through the progress reporter's own
connection; the newest of each kind wins."""

from __future__ import annotations

import time

from shoal.train.liveness import ProgressReporter
from shoal.train.rendezvous import Rendezvous, connect


def test_speed_and_progress_reach_the_store_from_the_reporters_thread():
    server = connect("127.0.0.1", 0, is_master=True)
    store = Rendezvous(server)
    reporter = ProgressReporter("w0", lambda: Rendezvous(connect("127.0.0.1", server.port)))
    try:
        for step in range(1, 6):
            reporter.report_progress(step)
        reporter.report_speed("w0", 123.5)
        deadline = time.monotonic() + 10
        while (store.progress(), store.speeds(("w0",))) != (5, [123.5]):
            assert time.monotonic() < deadline, (store.progress(), store.speeds(("w0",)))
            time.sleep(0.01)
    finally:
        reporter.stop()
