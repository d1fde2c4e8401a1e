"""A stand-in launcher: starts one WorkerProcess (`sleep`, or with `fork` a Python
sleeper forked from the preloaded server), prints its pid, then waits to be killed."""

import sys
import time
from pathlib import Path

from shoal.elastic import preload
from shoal.elastic.worker_process import WorkerProcess

# The guard multiprocessing asks of a main module: a forked worker's start imports it.
if __name__ == "__main__":
    forked = sys.argv[2:] == ["fork"]
    preload.PRELOAD = ("json",)  # what is preloaded does not matter here; torch would take seconds
    command = ([sys.executable, "-c", "import time; time.sleep(60)"] if not forked else
               [sys.executable, str(Path(__file__).parent / "sleeper.py")])
    worker = WorkerProcess("w0", command, {}, Path(sys.argv[1]), on_exit=lambda w: None,
                           preloaded=forked)
    assert forked == isinstance(worker.process, preload.ForkedWorker)
    print(worker.pid, flush=True)
    time.sleep(60)
