"""A stand-in worker for launcher tests: records when it got SIGTERM in
$MARKS/<LOCAL_RANK>; rank 0 then leaves, any other rank ignores it (a
worker stuck past the grace period)."""

import os
import signal
import sys
import time
from pathlib import Path

marks = Path(os.environ["MARKS"])
rank = os.environ["LOCAL_RANK"]


def on_term(*_: object) -> None:
    (marks / f"term-{rank}").write_text(repr(time.time()))
    if rank == "0":
        sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
(marks / f"up-{rank}").write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
