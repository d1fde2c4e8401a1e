"""One job's rendezvous store and membership authority in a process of their
own, with no workers: what the coordinator starts for each job it runs, and
what `shoal rendezvous` runs on a host that trains nothing. It also writes
the members' measured speeds (`speeds.json`) every two seconds.

Apart from the coordinator, a job host outlives the coordinator's restart:
workers keep their rendezvous while the coordinator is down. It writes
`host.json` (endpoint, pid) when it serves, `reached.json` (the newest step
every member has committed) as the job goes, and `final.json` when the job is
done or given up, then lingers so late workers can still read the store.

With a gate (`gate_dir`: what the coordinator runs for a market job), the
store listens on loopback only and the public address is a TLS gate that
admits a lease's token holders (`shoal.elastic.gate`): strangers
who learn the endpoint cannot write what the runtime acts on.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from shoal.elastic.authority import AuthorityConfig
from shoal.elastic.gate_keys import GateKeys, lease_identity
from shoal.elastic.liveness import LivenessConfig
from shoal.elastic.serve import RendezvousServer
from shoal.elastic.gate import StoreGate
from shoal.elastic.store_policy import StoreView
from shoal.errors import ControlError
from shoal.spec.worker import WorkerId
from shoal.train.rendezvous import Rendezvous, connect

log = logging.getLogger(__name__)
SPEEDS_EVERY = 20  # ticks of 0.1 s between writes of the members' measured speeds
REACHED_EVERY = 5  # ticks of 0.1 s between writes of the step every member reached


@dataclass(frozen=True)
class JobHostConfig:
    bind: str
    port: int  # 0: a free port, written to host.json
    run_dir: Path
    min_workers: int = 1
    stall_deadline_s: float = 1.0  # liveness floor, as `--stall-deadline-s` of the launcher
    linger_s: float = 10.0  # after the end, other hosts' workers may still read the store
    gate_dir: Path | None = None  # the gate's keys (GateKeys): serve behind a gate
    steps: int | None = None  # the job's: it ends only once every member finished them


def serve_job(config: JobHostConfig) -> dict[str, object]:
    """Serve until the job is done or given up; returns what final.json holds."""
    config.run_dir.mkdir(parents=True, exist_ok=True)
    server, gate, host = _serve(config)
    _write(config.run_dir / "host.json", {**host, "pid": os.getpid(), "t0": time.time()})
    (config.run_dir / "launch.json").write_text(json.dumps({"t0": time.time()}))
    server.start_authority(
        AuthorityConfig(min_workers=config.min_workers, steps=config.steps,
                        liveness=LivenessConfig(floor_s=config.stall_deadline_s)),
        process_alive=lambda worker: None,  # no worker runs here; their launchers report exits
        event_log=config.run_dir / "epochs.jsonl")
    log.info("job host on %s (run dir %s)", host["endpoint"], config.run_dir)
    cut = CutLeases(GateKeys.load(config.gate_dir), server.rdzv) if gate is not None else None
    try:
        ticks, reached = 0, read_reached(config.run_dir)
        while not server.rdzv.done():
            time.sleep(0.1)
            ticks += 1
            if cut is not None:
                cut.report()
            if ticks % SPEEDS_EVERY == 0:
                _write_speeds(server, config.run_dir)
            if ticks % REACHED_EVERY == 0:
                reached = _write_reached(server, config.run_dir, reached)
        _wait_for_exits(server, config.linger_s)
        failure = server.rdzv.failure()
        server.stop_authority()
        final = {"failed": failure} if failure else {"final": server.rdzv.final()}
        _write(config.run_dir / "final.json", final)
        time.sleep(config.linger_s)
        return final
    finally:
        if gate is not None:
            log.info("gate admitted %s, relayed %s requests", gate.admitted, gate.relayed)
            _write(config.run_dir / "gate.json", {"admitted": gate.admitted,
                                                  "relayed": gate.relayed,
                                                  "relayed_kinds": gate.relayed_kinds})
            gate.close()
        server.close()


class CutLeases:
    """The workers of leases the coordinator revoked, reported exited to the authority.

    The gate closes a revoked lease's connections (its lease ended: slashed, withdrawn,
    preempted past its notice), so none of its workers will vote again. One that had
    given notice would otherwise be waited for on the step in flight for the leaver's
    grace (30 s) while its peers stall: a slashed cheat cut off mid-step held its honest
    peer until the liveness rule fenced it, and the job went back to a checkpoint."""

    def __init__(self, keys: GateKeys, rdzv: Rendezvous) -> None:
        self.keys, self.rdzv = keys, rdzv
        self._revoked: frozenset[str] = frozenset()
        self._members: set[str] = set()  # of every epoch read so far
        self._read_to = -1  # the newest epoch read
        self._reported: set[str] = set()

    def report(self) -> None:
        try:
            revoked = self.keys.revoked()
        except ControlError:
            return  # being rewritten: the gate refuses every token meanwhile
        if not revoked:
            return
        latest = self.rdzv.latest_epoch()
        if revoked == self._revoked and latest == self._read_to:
            return
        self._revoked = revoked
        for epoch in range(self._read_to + 1, latest + 1):
            self._members.update(self.rdzv.epoch(epoch).members)
        self._read_to = max(self._read_to, latest)
        for worker in sorted(self._members - self._reported):
            named = WorkerId.leased(worker)
            if named is not None and lease_identity(named.lease) in revoked:
                log.info("%s's lease was revoked: it counts as exited", worker)
                self.rdzv.report_exit(worker)
                self._reported.add(worker)


def _serve(config: JobHostConfig) -> tuple[RendezvousServer, StoreGate | None, dict[str, str]]:
    """The store, served on (bind, port), or on loopback behind a gate there; and what
    host.json says of them: `endpoint` for the job's workers, `store` for this machine's
    coordinator (which reads the store directly), the gate's certificate hash."""
    if config.gate_dir is None:
        server = RendezvousServer(config.bind, config.port)
        return server, None, {"endpoint": server.endpoint, "store": server.endpoint}
    keys = GateKeys.create_or_load(config.gate_dir)
    server = RendezvousServer("127.0.0.1")
    try:
        gate = StoreGate(config.bind, config.port, ("127.0.0.1", server.port), keys,
                         view=store_view(Rendezvous(connect("127.0.0.1", server.port))))
    except BaseException:
        server.close()
        raise
    return server, gate, {"endpoint": f"{config.bind}:{gate.port}", "store": server.endpoint,
                          "cert_sha256": keys.cert_sha256()}


def store_view(rdzv: Rendezvous) -> StoreView:
    """What the gate's store policy reads of the store, on a connection of its own:
    published epochs' members (kept: an epoch never changes once published) and the
    newest epoch's number."""
    published: dict[int, tuple[str, ...]] = {}

    def members(epoch: int) -> tuple[str, ...] | None:
        if epoch not in published:
            if epoch > rdzv.latest_epoch():
                return None
            published[epoch] = rdzv.epoch(epoch).members
        return published[epoch]

    return StoreView(members=members, latest=rdzv.latest_epoch)


def _write_speeds(server: RendezvousServer, run_dir: Path) -> None:
    """The current members' samples/s, for the coordinator to hold offers to: each one's
    own measure, but the speed its share stood at for one whose claim the host's clock
    refuted (MembershipAuthority.published_speeds)."""
    rdzv = server.rdzv
    latest = rdzv.latest_epoch()
    if latest < 0:
        return
    members = rdzv.epoch(latest).members
    if server.authority is not None:
        speeds = server.authority.published_speeds(members)
    else:
        speeds = {m: s for m, s in zip(members, rdzv.speeds(members)) if s}
    _write(run_dir / "speeds.json", {"epoch": latest, "speeds": speeds, "t": time.time()})


def _write_reached(server: RendezvousServer, run_dir: Path, reached: int | None) -> int | None:
    """Write how far the job got, if further than `reached`; returns the newest value.

    The newest step every current member has committed, as their progress beats show
    (a beat names the step a member is on, so the one before it is committed); nothing
    until every member has beaten. Not one member's word: the coordinator settles pay and
    roots proof epochs by it, and members claiming a step far ahead move the lowest beat
    no higher than an honest peer's (nor, beating first in a new epoch, past one that has
    not beaten yet). Kept at its highest: a dip (a joiner beats step 0 until it has the
    state) is no news."""
    rdzv = server.rdzv
    try:
        latest = rdzv.latest_epoch()
        if latest < 0:
            return reached
        beats = rdzv.beats(list(rdzv.epoch(latest).members))
    except (ValueError, RuntimeError) as error:  # a member wrote a beat that does not parse
        log.warning("cannot read the members' progress beats: %s", error)
        return reached
    if not beats or None in beats.values():
        return reached
    step = min(beat.step for beat in beats.values()) - 1
    if reached is not None and step <= reached:
        return reached
    write_reached(run_dir, step)
    return step


def write_reached(run_dir: Path, step: int) -> None:
    """Say that every member of the job has committed `step` (what `read_reached` reads)."""
    _write(run_dir / "reached.json", {"step": step, "t": time.time()})


def read_reached(run_dir: Path) -> int | None:
    """The newest step every member of the job had committed when its host last looked
    (None: no member has beaten yet)."""
    path = run_dir / "reached.json"
    try:
        return int(json.loads(path.read_text())["step"]) if path.exists() else None
    except (ValueError, KeyError, TypeError, OSError):
        return None


def read_speeds(run_dir: Path) -> dict[str, float]:
    path = run_dir / "speeds.json"
    return json.loads(path.read_text())["speeds"] if path.exists() else {}


def _wait_for_exits(server: RendezvousServer, timeout_s: float) -> None:
    """Let the last members finish: the reporter adds figures (val_loss) after `done`,
    and its launcher reports its exit once the last of them is in."""
    rdzv = server.rdzv
    latest = rdzv.latest_epoch()
    members = list(rdzv.epoch(latest).members) if latest >= 0 else []
    deadline = time.monotonic() + timeout_s
    while members and time.monotonic() < deadline:
        if set(rdzv.exited(members)) >= set(members):
            return
        time.sleep(0.1)


def read_host(run_dir: Path) -> dict[str, object] | None:
    """The endpoint and pid a job host wrote, or None if it has not started yet."""
    path = run_dir / "host.json"
    return json.loads(path.read_text()) if path.exists() else None


def read_final(run_dir: Path) -> dict[str, object] | None:
    path = run_dir / "final.json"
    return json.loads(path.read_text()) if path.exists() else None


def _write(path: Path, value: dict[str, object]) -> None:
    """Whole or not at all: a reader never sees half a file."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    partial.replace(path)
