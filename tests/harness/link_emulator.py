"""A userspace link between two TAP devices, for kernels without tc netem:
one-way delay, a rate limit with a drop-tail queue, and random loss, per
direction (after Mahimahi's delay and link shells, written for this harness);
and a stranger on the path, who rewrites a byte of some TCP segments and fixes
their checksums so that the receiver takes them.

Run by tests/harness/netns.py as its own process, so its CPU is not the test's:

    python link_emulator.py PARENT_PID HOST_FD BRIDGE_FD SETTINGS_JSON CPU_TURN

HOST_FD is the TAP inside the host's namespace, BRIDGE_FD the one enslaved to
the bridge. Frames read from HOST_FD go "up" to BRIDGE_FD, the others "down".
Each stdin line is a JSON command, answered by one JSON line on stdout with
the counters: a settings object {"up": {...}, "down": {...}} (keys as in
`LinkSettings`), or {} to read the counters only. The process exits when stdin
closes or its parent dies; closing the TAP fds removes both devices.

Stdlib only: it runs as a script, outside the repository's packages.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import itertools
import json
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass

TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
READ_BYTES = 65536 + 64  # the largest TAP MTU plus the Ethernet header, with room
BURST = 64  # frames read from one fd before the due frames are delivered again
_TURNS = itertools.count()  # which CPU the next forwarder stays on (see stay_on_one_cpu)


@dataclass(frozen=True)
class LinkSettings:
    """One direction of an emulated link, as the forwarder applies it."""

    delay_ms: float = 0.0  # one way, added to every frame
    rate_mbit: float | None = None  # None: as fast as the forwarder goes, no queue
    loss_pct: float = 0.0  # share of frames lost at random
    queue_ms: float = 200.0  # drop-tail: the most backlog, as time at rate_mbit
    # A stranger on the path: the share of TCP segments with at least REWRITE_MIN bytes of
    # payload (bulk: tensors, not small requests) it rewrites, one bit of one byte each,
    # their checksums fixed; never those to or from `keep_port`.
    rewrite_pct: float = 0.0
    keep_port: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rewrite_pct <= 100:
            raise ValueError(f"rewrite_pct must be in [0, 100]: {self}")
        if self.delay_ms < 0 or self.queue_ms < 0 or not 0 <= self.loss_pct <= 100:
            raise ValueError(f"delay_ms and queue_ms must be >= 0 and loss_pct in [0, 100]: {self}")
        if self.rate_mbit is not None and self.rate_mbit <= 0:
            raise ValueError(f"rate_mbit must be positive, or None for no limit: {self}")


class LinkEmulatorError(RuntimeError):
    """The forwarder did not start or stopped answering."""


def open_tap(name: str) -> int:
    """A new TAP device `name` (Ethernet frames, no packet-info header); it lives while the fd is open."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class Forwarder:
    """The harness's handle on one forwarder process, which owns the two TAP fds."""

    def __init__(self, host_fd: int, bridge_fd: int, up: LinkSettings, down: LinkSettings,
                 timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(os.getpid()), str(host_fd), str(bridge_fd),
             _settings_json(up, down), str(next(_TURNS))],
            pass_fds=(host_fd, bridge_fd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._reply()

    @property
    def pid(self) -> int:
        return self.process.pid

    def configure(self, up: LinkSettings, down: LinkSettings) -> dict:
        """New settings for both directions, from the next frame on; returns the counters."""
        return self._ask(_settings_json(up, down))

    def counters(self) -> dict:
        """Per direction: frames and bytes in, lost, queue_drops, delivered."""
        return self._ask("{}")

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()

    def _ask(self, line: str) -> dict:
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise LinkEmulatorError(f"the forwarder exited ({self.process.poll()})") from None
        return self._reply()

    def _reply(self) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.process.kill()
            raise LinkEmulatorError(f"the forwarder did not answer within {self.timeout_s} s "
                                    f"(exit code {self.process.poll()})")
        reply = json.loads(line)
        if "error" in reply:
            raise LinkEmulatorError(reply["error"])
        return reply


def _settings_json(up: LinkSettings, down: LinkSettings) -> str:
    return json.dumps({"up": dataclasses.asdict(up), "down": dataclasses.asdict(down)})


# The forwarder process, from here on.


class Direction:
    """One way of the link: frames enter with `admit`, leave with `due`, in order.

    A frame departs at max(now, previous departure) + its bits / rate (the link
    sends one frame at a time), then arrives `delay_ms` later. The queue is
    measured in time: a frame is dropped on entry when the backlog ahead of it
    would take more than `queue_ms` to send (queue_ms x rate bytes). A lost
    frame still takes its slot on the link, as a frame corrupted on the wire
    would. Arrival times never decrease, so a FIFO keeps the order.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.configure(LinkSettings())
        self.last_departure = 0.0
        self.line: deque[tuple[float, bytes]] = deque()
        self.counts = {"frames": 0, "bytes": 0, "lost": 0, "queue_drops": 0, "delivered": 0,
                       "rewritten": 0}

    def configure(self, settings: LinkSettings) -> None:
        self.delay_s = settings.delay_ms / 1000
        self.bytes_per_s = None if settings.rate_mbit is None else settings.rate_mbit * 1e6 / 8
        self.queue_s = settings.queue_ms / 1000
        self.loss = settings.loss_pct / 100
        self.rewrite, self.keep_port = settings.rewrite_pct / 100, settings.keep_port

    def admit(self, frame: bytes, now: float) -> None:
        self.counts["frames"] += 1
        self.counts["bytes"] += len(frame)
        start = max(now, self.last_departure)
        if self.bytes_per_s is not None:
            if start - now > self.queue_s:
                self.counts["queue_drops"] += 1
                return
            start += len(frame) / self.bytes_per_s
        self.last_departure = start
        if self.loss and self.rng.random() < self.loss:
            self.counts["lost"] += 1
            return
        if self.rewrite and self.rng.random() < self.rewrite:
            rewritten = rewrite_tcp(frame, self.keep_port, self.rng)
            if rewritten is not None:
                frame = rewritten
                self.counts["rewritten"] += 1
        # A delay lowered by a new setting must not let a frame pass the ones before it.
        arrival = max(start + self.delay_s, self.line[-1][0] if self.line else 0.0)
        self.line.append((arrival, frame))

    def due(self, now: float) -> list[bytes]:
        frames = []
        while self.line and self.line[0][0] <= now:
            frames.append(self.line.popleft()[1])
        self.counts["delivered"] += len(frames)
        return frames

    def next_due(self) -> float | None:
        return self.line[0][0] if self.line else None


REWRITE_MIN = 512  # payload bytes of a segment a stranger rewrites


def rewrite_tcp(frame: bytes, keep_port: int | None, rng: random.Random) -> bytes | None:
    """`frame` with one bit of its TCP payload flipped and its TCP checksum fixed, or
    None if it is not an IPv4 TCP segment with REWRITE_MIN bytes of payload, or is to or
    from `keep_port`."""
    if len(frame) < 54 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
        return None
    ihl = (frame[14] & 0x0F) * 4
    total = struct.unpack_from("!H", frame, 16)[0]
    tcp = 14 + ihl
    offset = (frame[tcp + 12] >> 4) * 4
    end = 14 + total
    if end > len(frame) or end - (tcp + offset) < REWRITE_MIN:
        return None
    if keep_port is not None and keep_port in struct.unpack_from("!HH", frame, tcp):
        return None
    out = bytearray(frame)
    out[rng.randrange(tcp + offset, end)] ^= 1 << rng.randrange(8)
    out[tcp + 16:tcp + 18] = b"\x00\x00"
    pseudo = frame[26:34] + struct.pack("!BBH", 0, 6, end - tcp)
    struct.pack_into("!H", out, tcp + 16, _checksum(pseudo + bytes(out[tcp:end])))
    return bytes(out)


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def die_with(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(0)


def stay_on_one_cpu(turn: int) -> None:
    """Pin this process to one CPU, the `turn`-th allowed one (round robin, so the
    forwarders of a network spread out). A frame written to a TAP waits in the
    backlog of the writer's CPU; a forwarder that migrated could have frames written
    later overtake frames left on the CPU it left."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[turn % len(cpus)]})


def read_frames(fd: int) -> list[bytes]:
    frames = []
    for _ in range(BURST):
        try:
            frames.append(os.read(fd, READ_BYTES))
        except BlockingIOError:
            break
    return frames


def write_frames(fd: int, frames: list[bytes], direction: Direction) -> None:
    for frame in frames:
        try:
            os.write(fd, frame)
        except OSError:  # the device is going away, or its queue is full: the frame is lost
            direction.counts["delivered"] -= 1
            direction.counts["write_errors"] = direction.counts.get("write_errors", 0) + 1


def command(line: str, up: Direction, down: Direction) -> str:
    try:
        settings = json.loads(line)
        for name, direction in (("up", up), ("down", down)):
            if name in settings:
                direction.configure(LinkSettings(**settings[name]))
        return json.dumps({"up": up.counts, "down": down.counts})
    except (ValueError, TypeError) as error:
        return json.dumps({"error": str(error)})


def serve(host_fd: int, bridge_fd: int, up: Direction, down: Direction) -> None:
    control = sys.stdin.fileno()
    for fd in (host_fd, bridge_fd):
        os.set_blocking(fd, False)
    pending = b""
    while True:
        now = time.monotonic()
        write_frames(bridge_fd, up.due(now), up)
        write_frames(host_fd, down.due(now), down)
        times = [t for t in (up.next_due(), down.next_due()) if t is not None]
        # select, not epoll: its timeout has microseconds (epoll's has milliseconds),
        # and the delays are a millisecond or less on a fast link.
        timeout = max(0.0, min(times) - time.monotonic()) if times else None
        readable, _, _ = select.select([host_fd, bridge_fd, control], [], [], timeout)
        now = time.monotonic()
        for fd, direction in ((host_fd, up), (bridge_fd, down)):
            if fd in readable:
                for frame in read_frames(fd):
                    direction.admit(frame, now)
        if control in readable:
            data = os.read(control, 65536)
            if not data:
                return  # the harness closed the link (or died)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                sys.stdout.write(command(line.decode(), up, down) + "\n")
                sys.stdout.flush()


def main(argv: list[str]) -> None:
    parent_pid, host_fd, bridge_fd, settings, turn = (int(argv[0]), int(argv[1]), int(argv[2]),
                                                      argv[3], int(argv[4]))
    die_with(parent_pid)
    stay_on_one_cpu(turn)
    rng = random.Random()
    up, down = Direction(rng), Direction(rng)
    reply = command(settings, up, down)
    print(reply, flush=True)  # the harness waits for this line: the link is up
    if "error" in json.loads(reply):
        sys.exit(1)
    serve(host_fd, bridge_fd, up, down)


if __name__ == "__main__":
    main(sys.argv[1:])
