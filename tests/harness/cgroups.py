"""Uneven devices made real with Linux cgroups, for benchmarks and tests.

A `CpuCap` is a cgroup whose CFS bandwidth limit lets its processes use at
most `cores` of CPU time however many threads they run: cgroup v2
`cpu.max`, or `cpu.cfs_quota_us` / `cpu.cfs_period_us` where the cpu
controller sits on a v1 hierarchy. The kernel throttles the process, so a
capped worker is slower the way a slower device is (its collectives and
store traffic too), not by a sleep inside it. Caps live in a `CpuSlice`
whose CPU weight can be raised, so that on a machine shared with other
work a cap is what limits its processes, not the neighbours. Needs root.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "shoal"  # slices are shoal-<pid>-<name> under each hierarchy's root
ENTER_ENV = "SHOAL_CGROUP_PROCS"  # colon-separated cgroup.procs files a wrapped command joins
DEFAULT_PERIOD_S = 0.01  # short periods spread a small quota evenly instead of in bursts
_V1_SHARES, _V2_WEIGHT = 1024, 100  # the default CPU weight of each interface
_RMDIR_TRIES = 50

# `sh` writes its own pid into every listed cgroup, then becomes the command (exec keeps
# the pid), so everything the command starts, torch's threads included, is in the cap.
_ENTER_SCRIPT = ('IFS=:; for f in ${%s:-}; do echo $$ > "$f" || exit 125; done; unset IFS; '
                 'exec "$@"') % ENTER_ENV


class CgroupUnavailable(RuntimeError):
    """CPU caps cannot be made here (not root, no cpu controller, or read-only cgroupfs)."""


@dataclass(frozen=True)
class Hierarchies:
    """Where a cap's files live: the cpu controller, and CPU-time accounting."""

    version: int  # 2, or 1 (cpu controller on a v1 hierarchy)
    cpu: Path  # root of the hierarchy with the cpu controller
    acct: Path | None  # v1: root of the cpuacct hierarchy (the same as cpu when co-mounted)


def find_hierarchies() -> Hierarchies:
    """Raise CgroupUnavailable with the reason when caps cannot be made here."""
    if os.geteuid() != 0:
        raise CgroupUnavailable("CPU caps with cgroups need root")
    mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    v1: dict[str, Path] = {}
    for fields in mounts:
        sep = fields.index("-")
        fstype, point, options = fields[sep + 1], Path(fields[4]), fields[sep + 3].split(",")
        if fstype == "cgroup2" and "cpu" in _read(point / "cgroup.controllers").split():
            return _writable(Hierarchies(2, point, None))
        if fstype == "cgroup":
            for controller in ("cpu", "cpuacct"):
                if controller in options:
                    v1.setdefault(controller, point)
    if "cpu" not in v1:
        raise CgroupUnavailable("no cgroup hierarchy has the cpu controller (cgroup v2 "
                                "without +cpu, and no v1 cpu mount)")
    return _writable(Hierarchies(1, v1["cpu"], v1.get("cpuacct")))


def _writable(found: Hierarchies) -> Hierarchies:
    probe = found.cpu / f"{PREFIX}-{os.getpid()}-probe"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        raise CgroupUnavailable(f"cannot create a cgroup under {found.cpu}: {error}") from None
    if found.version == 2:
        subtree = found.cpu / "cgroup.subtree_control"
        if "cpu" not in _read(subtree).split():
            try:
                subtree.write_text("+cpu")
            except OSError as error:
                raise CgroupUnavailable(f"cannot enable the cpu controller in {subtree}: "
                                        f"{error}") from None
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def entering(command: list[str]) -> list[str]:
    """`command`, started inside the caps named by ENTER_ENV in its environment (if any)."""
    return ["sh", "-c", _ENTER_SCRIPT, "sh", *command]


class CpuCap:
    """One cgroup: at most `cores` of CPU, measured over periods of `period_s`."""

    def __init__(self, slice_: CpuSlice, name: str, cores: float | None, period_s: float) -> None:
        found = slice_.found
        self.name, self.cores = name, cores
        self.dirs = [d / name for d in slice_.dirs]
        for directory in self.dirs:
            directory.mkdir()
        self.cpu_dir = self.dirs[0]
        if cores is not None:
            period_us = int(period_s * 1e6)
            quota_us = max(1000, int(cores * period_us))  # the kernel's least quota is 1 ms
            if found.version == 2:
                (self.cpu_dir / "cpu.max").write_text(f"{quota_us} {period_us}")
            else:
                (self.cpu_dir / "cpu.cfs_period_us").write_text(str(period_us))
                (self.cpu_dir / "cpu.cfs_quota_us").write_text(str(quota_us))
        self._version = found.version

    def env(self) -> dict[str, str]:
        """The environment that makes an `entering(...)` command start in this cap."""
        return {ENTER_ENV: ":".join(str(d / "cgroup.procs") for d in self.dirs)}

    def add(self, pid: int) -> None:
        for directory in self.dirs:
            (directory / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in _read(self.cpu_dir / "cgroup.procs").split()]

    def usage_s(self) -> float | None:
        """CPU seconds used by everything that ran in this cap (None: no accounting)."""
        if self._version == 2:
            stat = dict(line.split() for line in _read(self.cpu_dir / "cpu.stat").splitlines())
            return int(stat["usage_usec"]) / 1e6 if "usage_usec" in stat else None
        acct = [d for d in self.dirs if (d / "cpuacct.usage").exists()]
        return int(_read(acct[0] / "cpuacct.usage")) / 1e9 if acct else None

    def throttled(self) -> tuple[int, int]:
        """(periods with runnable work, periods in which the cap stopped it)."""
        stat = dict(line.split() for line in _read(self.cpu_dir / "cpu.stat").splitlines())
        return int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0))


class CpuSlice:
    """A parent cgroup for caps, weighted `priority` times the default against its
    siblings, so that on a busy machine its caps still get their quota."""

    def __init__(self, name: str, priority: float = 1.0) -> None:
        self.found = find_hierarchies()
        roots = [self.found.cpu]
        if self.found.acct is not None and self.found.acct != self.found.cpu:
            roots.append(self.found.acct)
        _remove_stale(roots)
        self.dirs = [root / f"{PREFIX}-{os.getpid()}-{name}" for root in roots]
        self.caps: list[CpuCap] = []
        for directory in self.dirs:
            directory.mkdir()
        if self.found.version == 2:
            (self.dirs[0] / "cgroup.subtree_control").write_text("+cpu")
            weight = min(10000, max(1, int(_V2_WEIGHT * priority)))
            (self.dirs[0] / "cpu.weight").write_text(str(weight))
        else:
            (self.dirs[0] / "cpu.shares").write_text(str(max(2, int(_V1_SHARES * priority))))
        self._roots = roots

    def cap(self, name: str, cores: float | None, period_s: float = DEFAULT_PERIOD_S) -> CpuCap:
        """A cap of `cores` (None: no cap, only the slice's weight)."""
        cap = CpuCap(self, name, cores, period_s)
        self.caps.append(cap)
        return cap

    def close(self) -> None:
        """Move whatever is left back to the roots (this process included) and remove the
        groups. Processes are never killed here: their owner ends them."""
        for cap in self.caps:
            for directory, root in zip(cap.dirs, self._roots):
                _drain(directory, root)
        for directory, root in zip(self.dirs, self._roots):
            _drain(directory, root)

    def __enter__(self) -> CpuSlice:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _drain(directory: Path, root: Path) -> None:
    """Move every process in `directory` to `root`, then remove it (a process that just
    left may still count for a moment, hence the retries)."""
    for _ in range(_RMDIR_TRIES):
        for pid in _read(directory / "cgroup.procs").split():
            try:
                (root / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # it exited meanwhile
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def _remove_stale(roots: list[Path]) -> None:
    """Remove empty slices left by processes that died without closing them."""
    for root in roots:
        for slice_dir in root.glob(f"{PREFIX}-*-*"):
            owner = slice_dir.name.split("-")[1]
            if not owner.isdigit() or Path(f"/proc/{owner}").exists():
                continue
            for cap_dir in [d for d in slice_dir.iterdir() if d.is_dir()]:
                _try_rmdir(cap_dir)
            _try_rmdir(slice_dir)


def _try_rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass  # still has processes: not ours to move
