"""The CPU-cap harness does what bench/het.py relies on: a command wrapped by
`entering` starts inside its cap, a capped busy loop gets about its quota of
CPU and no more, and closing the slice leaves no cgroup behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.harness.cgroups import CgroupUnavailable, CpuSlice, entering, find_hierarchies

try:
    find_hierarchies()
    UNAVAILABLE = ""
except CgroupUnavailable as error:
    UNAVAILABLE = str(error)

pytestmark = pytest.mark.skipif(bool(UNAVAILABLE), reason=f"cgroup CPU caps: {UNAVAILABLE}")

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n"


def test_wrapped_command_starts_inside_its_cap():
    with CpuSlice("test-enter") as slice_:
        cap = slice_.cap("w0", cores=0.5)
        out = subprocess.run(entering(["cat", "/proc/self/cgroup"]), env=cap.env(),
                             capture_output=True, text=True, timeout=10, check=True).stdout
        assert f"/{cap.cpu_dir.parent.name}/w0" in out
        # Without the variable the wrapper only runs the command.
        plain = subprocess.run(entering(["true"]), env={}, timeout=10)
        assert plain.returncode == 0
    assert not any(d.exists() for d in cap.dirs + slice_.dirs)


def test_capped_busy_loop_gets_its_quota_and_no_more():
    seconds, cores = 1.5, 0.2
    # A high weight so that neighbours on a shared machine do not starve the cap.
    with CpuSlice("test-quota", priority=16) as slice_:
        cap = slice_.cap("w0", cores=cores)
        start = time.monotonic()
        subprocess.run(entering([sys.executable, "-c", SPIN.format(s=seconds)]), env=cap.env(),
                       timeout=30, check=True)
        wall = time.monotonic() - start
        used = cap.usage_s()
        periods, throttled = cap.throttled()
    assert periods > 0 and throttled > 0.5 * periods  # the cap, not the loop, set the pace
    if used is not None:
        # Interpreter start-up is included and also capped; a generous lower bound
        # tolerates a very busy machine.
        assert used / wall <= cores * 1.15
        assert used / wall >= cores * 0.5
