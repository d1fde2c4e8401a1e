"""A job's code run where it cannot reach the provider (issue 41, first part).

A bundled job is a stranger's code. It runs under bubblewrap (Debian's
`bubblewrap`): in namespaces of its own, as an unprivileged user, seeing only
the system's programs and libraries and the Python it runs on (read-only), a
few files of /etc that name no secret, a private /tmp, and its own directory
(read-write): not the agent's keys, not the provider's other files. Its
processes and memory are capped by a cgroup of its own, and `close` ends
every process in it, however many it forked.

Its CPU time can be capped too (CFS bandwidth: a lease's share of the machine's
cores, however many processes it runs). Its directory can be a `Disk` of its
own: a file system of a fixed size in an image file, mounted there, so a job
that fills its directory fills only that (the provider's disk keeps its room),
and gone when the lease is.

What it does not do yet: a network limited to the job's peers, gate and data
(today: all of the host's network, or none).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shoal import ShoalError

_CGROUP_V1 = Path("/sys/fs/cgroup")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32")
# Of /etc, what a Python program and its TLS clients need, and no credential.
_ETC = ("/etc/ssl", "/etc/ca-certificates", "/etc/resolv.conf", "/etc/hosts",
        "/etc/nsswitch.conf", "/etc/localtime", "/etc/ld.so.cache", "/etc/alternatives")
_NOBODY = 65534
_CPU_PERIOD_US = 100_000


class SandboxError(ShoalError):
    """The sandbox cannot be set up on this host (no bubblewrap, no cgroup to use)."""


@dataclass(frozen=True)
class Limits:
    """What one job's processes may use together."""

    processes: int = 512
    memory_bytes: int = 8 << 30
    disk_bytes: int = 20 << 30  # the job's own directory (a `Disk`), where the agent makes one
    cpus: float | None = None  # CPU time per wall second, in cores (None: uncapped)
    network: bool = True  # the host's network; False: none at all


class Disk:
    """A file system of `size_bytes` (ext4 in a sparse image file beside `directory`),
    mounted at `directory` (nosuid, nodev): what a job writes there counts against it
    alone. `release` unmounts it and removes the image."""

    def __init__(self, directory: Path, size_bytes: int) -> None:
        self.directory = directory.resolve()
        self.image = self.directory.parent / f".{self.directory.name}.disk"
        if size_bytes < 16 << 20:
            raise SandboxError(f"a job's disk of {size_bytes} bytes: at least 16 MiB")
        self.release()  # one an agent that died left mounted
        self.directory.mkdir(parents=True, exist_ok=True)
        if any(self.directory.iterdir()):
            raise SandboxError(f"{self.directory} is not empty: a job's disk is mounted on an "
                               "empty directory")
        with open(self.image, "wb") as image:
            image.truncate(size_bytes)  # sparse: the provider's disk is used as it fills
        # Owned by the agent's user, as the directory it replaces: the job's user is that
        # user mapped into the sandbox's namespace.
        for command in (["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)],
                        ["mount", "-o", "loop,nosuid,nodev", str(self.image),
                         str(self.directory)]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                self.image.unlink(missing_ok=True)
                raise SandboxError(f"cannot make the job's disk ({' '.join(command[:1])}: "
                                   f"{done.stderr.strip() or done.returncode}); the agent "
                                   "runs bundled jobs as root, with e2fsprogs")
        (self.directory / "lost+found").rmdir()

    def release(self) -> None:
        """Unmount (lazily, if a process still holds it: it is gone once that is) and
        remove the image; nothing if there is none."""
        self.release_image(self.image)

    @staticmethod
    def release_image(image: Path) -> None:
        """Release the disk whose image is `image` (also one a killed agent left)."""
        directory = image.parent / image.name.removeprefix(".").removesuffix(".disk")
        if os.path.ismount(directory):
            subprocess.run(["umount", "-l", str(directory)], capture_output=True)
        image.unlink(missing_ok=True)


def sandbox_problem() -> str | None:
    """Why this host cannot run sandboxes, or None if it can."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (`apt-get install bubblewrap`)"
    if shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 is not installed (`apt-get install e2fsprogs`): no disk to cap a job's"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control): no disk of its own to give a job"
    for controller in ("pids", "memory"):
        if not (_CGROUP_V1 / controller / "cgroup.procs").is_file():
            return f"no cgroup v1 {controller} controller at {_CGROUP_V1 / controller}"
        if not os.access(_CGROUP_V1 / controller, os.W_OK):
            return f"cannot make cgroups under {_CGROUP_V1 / controller} (run the agent as root)"
    return None


class Sandbox:
    """Runs commands for job `name` confined to `directory` (created if missing), with
    `read_only` paths (the job's environment, the Python it runs on) visible too."""

    def __init__(self, name: str, directory: Path, *, read_only: Sequence[Path] = (),
                 limits: Limits = Limits()) -> None:
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            raise SandboxError("bubblewrap is not installed: `apt-get install bubblewrap` "
                               "(a provider runs strangers' code only inside it)")
        self.name, self.directory, self.limits = name, directory.resolve(), limits
        self.directory.mkdir(parents=True, exist_ok=True)
        interpreter = Path(sys.base_prefix).resolve()
        self.read_only = tuple(dict.fromkeys(Path(p).resolve() for p in (interpreter, *read_only)))
        self._groups = self._make_groups()

    def _make_groups(self) -> dict[str, Path]:
        """A pids, a memory and (with a CPU cap) a cpu cgroup of this job's own (cgroup
        v1, as on this host's kernel; a host on cgroup v2 alone is said, not run
        unconfined)."""
        groups = {}
        caps: list[tuple[str, dict[str, int]]] = [
            ("pids", {"pids.max": self.limits.processes}),
            ("memory", {"memory.limit_in_bytes": self.limits.memory_bytes})]
        if self.limits.cpus is not None:  # CFS bandwidth: this much CPU time per period
            caps.append(("cpu", {"cpu.cfs_period_us": _CPU_PERIOD_US, "cpu.cfs_quota_us":
                                 max(1000, int(self.limits.cpus * _CPU_PERIOD_US))}))
        for controller, limits in caps:
            root = _CGROUP_V1 / controller
            if not (root / "cgroup.procs").is_file():
                raise SandboxError(f"no cgroup v1 {controller} controller at {root}: this "
                                   "host cannot cap a job's processes and memory yet")
            group = root / "shoal" / self.name
            try:
                group.mkdir(parents=True, exist_ok=True)
                for limit_file, limit in limits.items():
                    (group / limit_file).write_text(str(limit))
            except OSError as error:
                raise SandboxError(f"cannot make the cgroup {group} ({error.strerror}): the "
                                   "agent runs bundled jobs as root") from None
            groups[controller] = group
        return groups

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` as bubblewrap runs it for this job."""
        out = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-all",
               "--unshare-user", "--uid", str(_NOBODY), "--gid", str(_NOBODY),
               "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        if self.limits.network:
            out.append("--share-net")
        for path in (*_SYSTEM, *_ETC):
            if Path(path).exists():
                out += ["--ro-bind", path, path]
        for path in self.read_only:
            out += ["--ro-bind", str(path), str(path)]
        out += ["--bind", str(self.directory), str(self.directory),
                "--chdir", str(self.directory), "--", *argv]
        return out

    def start(self, argv: Sequence[str], env: Mapping[str, str], *, stdout: object = None,
              stderr: object = None) -> subprocess.Popen:
        """Start `argv` in the sandbox with exactly `env` (nothing of the agent's own)."""
        procs = [str(group / "cgroup.procs") for group in self._groups.values()]

        def enter() -> None:  # in the child, before bubblewrap runs: all it starts is capped
            for path in procs:
                with open(path, "w") as handle:
                    handle.write(str(os.getpid()))

        return subprocess.Popen(self.command(argv), env=dict(env), stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, preexec_fn=enter)

    def signal(self, process: subprocess.Popen, signum: int) -> None:
        """Send `signum` to the command `process` (a `start`ed bubblewrap) runs.

        bubblewrap passes no signal on: a SIGTERM to it kills it, and the job dies with it
        at once, where a graceful leave must reach the job's launcher. In the job's own pid
        namespace bubblewrap's monitor is pid 1 and the command pid 2; that process is
        found from the outside as the monitor's child, whom the job cannot change.
        """
        for monitor in _children(process.pid):
            for command in _children(monitor):
                try:
                    os.kill(command, signum)
                except ProcessLookupError:
                    pass

    def processes(self) -> list[int]:
        """The job's processes still running (none once it is closed)."""
        try:
            text = (self._groups["pids"] / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(pid) for pid in text.split()]

    def close(self, timeout_s: float = 10.0) -> None:
        """End every process of the job and remove its cgroups."""
        deadline = time.monotonic() + timeout_s
        while (alive := self.processes()) and time.monotonic() < deadline:
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for group in self._groups.values():
            try:
                group.rmdir()
            except OSError:
                pass  # a process that outlived the kills keeps it; said by `processes`


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return found
