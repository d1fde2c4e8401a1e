"""One installer at a time: `make test` runs tests in several processes
(pytest-xdist), and two of them may find the same package missing at once.
Two `apt-get install`s fight over dpkg's lock and two `npm ci`s over one
node_modules; each install runs under this machine-wide lock, and whoever
waited checks again before installing."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def one_installer(what: str) -> Iterator[None]:
    """Hold the machine-wide lock for installing `what` (apt: every package shares one)."""
    path = Path(tempfile.gettempdir()) / f"shoal-tests-install-{what}.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield
