"""Hosts made real with Linux network namespaces, for multi-host tests.

Each host is a namespace with loopback up and one veth link to a bridge in
the root namespace, with its own address in a private /24 that this module
creates (10.231.N.0/24, N free on this machine). Only those addresses are
ever targets. A partition disables the host's bridge port, so packets are
dropped silently both ways: no FIN, no RST, the way a dead link behaves.
`Host.emulate` swaps a host's veth for a pair of TAP devices joined by a
userspace forwarder (link_emulator.py) that adds delay, a rate limit and loss,
since this kernel has no tc netem. Needs root and iproute2 (`ip`, `bridge`, `tc`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.installs import one_installer
from tests.harness.link_emulator import Forwarder, LinkEmulatorError, LinkSettings, open_tap

PREFIX = "shoal"  # namespaces are shoal-<pid>-<host>; links shb<pid>, shv<pid>h<i>, TAPs sht/shn<pid>h<i>
_RUN_TIMEOUT_S = 10.0


class HarnessUnavailable(RuntimeError):
    """This machine cannot host network namespaces (not root, no iproute2, no kernel support)."""


class HarnessUnsupported(RuntimeError):
    """One feature (e.g. tc netem) is missing from this kernel; the rest works."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=_RUN_TIMEOUT_S)


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check,
                          timeout=_RUN_TIMEOUT_S)


def ensure_tools() -> None:
    """Raise HarnessUnavailable with the reason when namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise HarnessUnavailable("network-namespace tests need root")
    if shutil.which("ip") is None or shutil.which("bridge") is None:
        if shutil.which("apt-get") is None:
            raise HarnessUnavailable("iproute2 (`ip`, `bridge`) is missing and apt-get is not available")
        _install_iproute2()
    probe = f"{PREFIX}-{os.getpid()}-probe"
    result = _ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        raise HarnessUnavailable(f"`ip netns add` failed: {result.stderr.strip()}")
    _ip("netns", "del", probe, check=False)


def _install_iproute2() -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with one_installer("apt"):
        if shutil.which("ip") and shutil.which("bridge"):  # another test did, meanwhile
            return
        for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "iproute2"]):
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
            if done.returncode != 0:
                raise HarnessUnavailable(f"installing iproute2 failed: {done.stderr.strip()[-300:]}")


def reap_stale() -> None:
    """Remove namespaces and links left by earlier test processes that died uncleanly."""
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == PREFIX and parts[1].isdigit() and not _alive(int(parts[1])):
            _kill_pids(name)
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        digits = link[3:].split("h")[0]
        if link[:3] in ("shb", "shv", "sht") and digits.isdigit() and not _alive(int(digits)):
            _ip("link", "del", link, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _pids(namespace: str) -> list[int]:
    result = _ip("netns", "pids", namespace, check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()]


def _kill_pids(namespace: str, timeout_s: float = 5.0) -> None:
    """SIGKILL every process in the namespace until none is left (children included)."""
    deadline = time.monotonic() + timeout_s
    while (pids := _pids(namespace)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _free_subnet() -> int:
    """A third octet N such that 10.231.N.0/24 is not in use on this machine."""
    used = _ip("-4", "-o", "addr", "show").stdout + _ip("-4", "route", "show").stdout
    start = os.getpid() % 250
    for offset in range(250):
        n = (start + offset) % 250
        if f"10.231.{n}." not in used:
            return n
    raise HarnessUnavailable("no free /24 in 10.231.0.0/16")


@dataclass
class Host:
    """One namespace: `address` is its only address besides loopback."""

    name: str
    namespace: str
    address: str
    link: str  # the root-side end of its veth (or TAP, once emulated), a port of the bridge
    bridge: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    forwarder: Forwarder | None = None  # set by emulate()

    def popen(self, command: list[str], *, log: Path | None = None, env: dict[str, str] | None = None,
              cwd: str | Path | None = None) -> subprocess.Popen:
        """Start `command` inside this host; its output goes to `log` (or is discarded)."""
        output = open(log, "ab") if log else subprocess.DEVNULL
        try:
            process = subprocess.Popen(["ip", "netns", "exec", self.namespace, *command], env=env,
                                       cwd=cwd, stdout=output, stderr=subprocess.STDOUT)
        finally:
            if log:
                output.close()
        self.processes.append(process)
        return process

    def run(self, command: list[str], timeout_s: float = _RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.namespace, *command], capture_output=True,
                              text=True, timeout=timeout_s)

    def pids(self) -> list[int]:
        return _pids(self.namespace)

    def kill(self) -> None:
        """The whole host dies at once: every process in it is SIGKILLed."""
        _kill_pids(self.namespace)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1)

    def partition(self) -> None:
        """Drop every packet to and from this host, silently (the bridge port stops forwarding)."""
        _sh("bridge", "link", "set", "dev", self.link, "state", "0")

    def heal(self) -> None:
        _sh("bridge", "link", "set", "dev", self.link, "state", "3")  # forwarding

    def degrade(self, delay_ms: float = 0.0, loss_pct: float = 0.0) -> None:
        """Add delay and loss to both directions of this host's link: tc netem on both ends
        of its veth, or the userspace emulator (emulate()) where the kernel has no netem."""
        if self.forwarder is None and self._netem(delay_ms, loss_pct):
            return
        self.emulate(delay_ms=delay_ms, loss_pct=loss_pct)

    def _netem(self, delay_ms: float, loss_pct: float) -> bool:
        """tc netem on both ends of the veth; False, with nothing changed, without netem."""
        spec = ["delay", f"{delay_ms}ms", "loss", f"{loss_pct}%"]
        for prefix in ([], ["ip", "netns", "exec", self.namespace]):
            result = _sh(*prefix, "tc", "qdisc", "replace", "dev", self._dev(prefix), "root",
                         "netem", *spec, check=False)
            if result.returncode != 0:
                self.restore()
                return False
        return True

    def emulate(self, delay_ms: float = 0.0, rate_mbit: float | None = None, loss_pct: float = 0.0,
                queue_ms: float = 200.0, mtu: int | None = None, rewrite_pct: float = 0.0,
                keep_port: int | None = None) -> None:
        """Shape both directions of this host's link alike in a userspace forwarder: each
        frame is sent at `rate_mbit` (None: no limit) behind a drop-tail queue of at most
        `queue_ms` of backlog, lost with probability `loss_pct`, then delayed by `delay_ms`.
        The first call swaps the veth for a TAP pair (same address and MAC); later calls
        change the settings in place. `mtu` sets both TAPs' MTU: a larger one than the
        other hosts' still carries TCP (each end's MSS is the smaller), not large UDP.
        `rewrite_pct`: a stranger on the path rewrites that share of bulk TCP segments
        (a bit of one byte each, checksums fixed), but none to or from `keep_port`."""
        link = LinkSettings(delay_ms=delay_ms, rate_mbit=rate_mbit, loss_pct=loss_pct,
                            queue_ms=queue_ms, rewrite_pct=rewrite_pct, keep_port=keep_port)
        if mtu is not None and not 576 <= mtu <= 65535:
            raise ValueError(f"mtu must be in [576, 65535] (a TAP device's range), not {mtu}")
        if self.forwarder is None:
            self._swap_veth_for_taps(link)
        else:
            self.forwarder.configure(up=link, down=link)
        if mtu is not None:
            _ip("-n", self.namespace, "link", "set", "eth0", "mtu", str(mtu))
            _ip("link", "set", self.link, "mtu", str(mtu))

    def link_counters(self) -> dict:
        """The emulator's counters per direction ("up": from this host): frames, bytes,
        lost, queue_drops, delivered."""
        if self.forwarder is None:
            raise HarnessUnsupported(f"{self.name}'s link is not emulated (call emulate() first)")
        return self.forwarder.counters()

    def restore(self) -> None:
        """Remove any netem on this host's link; an emulated link passes frames unchanged."""
        if self.forwarder is not None:
            self.forwarder.configure(up=LinkSettings(), down=LinkSettings())
            return
        for prefix in ([], ["ip", "netns", "exec", self.namespace]):
            _sh(*prefix, "tc", "qdisc", "del", "dev", self._dev(prefix), "root", check=False)

    def close_link(self) -> None:
        """Stop the forwarder, if any: closing its fds removes both TAP devices."""
        if self.forwarder is not None:
            self.forwarder.close()

    def _swap_veth_for_taps(self, link: LinkSettings) -> None:
        # Both TAPs are made here in the root namespace; the host's one then moves into
        # the host's namespace, where its fd still reads and writes its frames.
        inner, outer = "shn" + self.link[3:], "sht" + self.link[3:]  # shv<pid>h<i> -> shn/sht<pid>h<i>
        mac = _ip("-n", self.namespace, "-o", "link", "show", "eth0").stdout.split("link/ether ")[1].split()[0]
        try:
            fds = [open_tap(inner), open_tap(outer)]
        except OSError as error:
            raise HarnessUnsupported(f"no tc netem, and no TAP devices for the userspace emulator "
                                     f"(/dev/net/tun: {error})") from error
        try:
            _ip("link", "set", inner, "netns", self.namespace)
            _ip("-n", self.namespace, "link", "del", "eth0")  # the veth, both ends
            _ip("-n", self.namespace, "link", "set", inner, "name", "eth0", "address", mac)
            _ip("-n", self.namespace, "addr", "add", f"{self.address}/24", "dev", "eth0")
            _ip("-n", self.namespace, "link", "set", "eth0", "up")
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            self.link = outer
            self.forwarder = Forwarder(fds[0], fds[1], up=link, down=link)
        except LinkEmulatorError as error:
            raise HarnessUnsupported(f"the userspace link emulator did not start: {error}") from error
        finally:
            for fd in fds:  # the forwarder holds its own copies; the TAPs live as long as it does
                os.close(fd)

    def _dev(self, prefix: list[str]) -> str:
        return "eth0" if prefix else self.link


class Network:
    """A bridge and the hosts attached to it; `close()` removes every trace."""

    def __init__(self) -> None:
        reap_stale()
        self.tag = str(os.getpid())
        self.subnet = _free_subnet()
        self.bridge = f"shb{self.tag}"
        self.hosts: list[Host] = []
        self._forwarder_pids: list[int] = []  # for leftovers(): none may outlive close()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"10.231.{self.subnet}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        namespace = f"{PREFIX}-{self.tag}-{name}"
        link, peer = f"shv{self.tag}h{index}", f"shp{self.tag}h{index}"
        address = f"10.231.{self.subnet}.{index}"
        _ip("netns", "add", namespace)
        host = Host(name, namespace, address, link, self.bridge)
        self.hosts.append(host)  # registered before it is complete: close() cleans a half-made one
        _ip("link", "add", link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", namespace)
        _ip("-n", namespace, "link", "set", peer, "name", "eth0")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("link", "set", link, "master", self.bridge)
        _ip("link", "set", link, "up")
        return host

    def close(self) -> None:
        for host in self.hosts:
            host.kill()
            if host.forwarder is not None:
                self._forwarder_pids.append(host.forwarder.pid)
            host.close_link()
            _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.link, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts = []

    def leftovers(self) -> list[str]:
        """Namespaces and links of this network that still exist (empty after close())."""
        names = _ip("netns", "list").stdout + _ip("-o", "link", "show").stdout
        mine = [f"{PREFIX}-{self.tag}-", f"shb{self.tag}", f"shv{self.tag}h", f"sht{self.tag}h"]
        left = [line.split()[0] for line in names.splitlines() if any(m in line for m in mine)]
        return left + [f"forwarder {pid}" for pid in self._forwarder_pids if _alive(pid)]
