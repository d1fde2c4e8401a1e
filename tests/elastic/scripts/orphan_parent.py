"""A stand-in launcher: starts one WorkerProcess (`sleep`), prints its pid,
then waits to be killed."""

import sys
import time
from pathlib import Path

from shoal.elastic.worker_process import WorkerProcess

worker = WorkerProcess("w0", ["sleep", "60"], {}, Path(sys.argv[1]), on_exit=lambda w: None)
print(worker.pid, flush=True)
time.sleep(60)
