"""The rendezvous store's key schema, shared by the membership authority and
the workers. Everything that crosses processes goes through here, as
pydantic values from `shoal.spec`, so the protocol lives in one file.

Keys never repeat across epochs (gloo reads peer addresses from the store;
stale ones break new groups). Each member casts its ballot on a step under a
key of its own, and the membership authority alone writes the step's decision,
once, with compare-and-set, so every worker reads the same outcome.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
import time
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

from shoal.spec.elastic import (
    MembershipEpoch,
    ProgressBeat,
    StepBallot,
    StepDecision,
    WorkerArrival,
)
from shoal.train.errors import TrainError

_CONNECT_TIMEOUT_S = 60.0
log = logging.getLogger(__name__)
T = TypeVar("T")
# Short waits poll `check` (Rendezvous.wait_keys): pauses grow from the first to the last by
# this factor, so a key is seen at most ~30% of the time waited after it was set, and at
# most 5 ms after; waits this long or longer block in the store instead.
_FIRST_PAUSE_S, _LAST_PAUSE_S, _PAUSE_GROWTH = 0.0002, 0.005, 1.3
_BLOCKING_WAIT_S = 1.0
# While a worker waits on peers (a collective, a step's decision), the least time between two
# looks for a newer epoch (and the run's failure): each is a round trip (through a market
# job's gate, two more relays), and a recovery takes far longer than the look it waits for.
EPOCH_LOOK_S = 0.02
# What `Rendezvous.read` compares with: no key the runtime writes ever holds it.
_ABSENT = "\x00shoal:absent"
_ABSENT_BYTES = _ABSENT.encode()
# A read a job host's gate holds until its key is set (shoal.elastic.gate): the same
# compare-and-set that cannot change anything, whose value asks the gate to answer once
# the key exists, or after the milliseconds that follow the prefix, with the value itself
# (as the store answers for a missing key). A store with no gate answers at once so.
HELD_READ = b"\x00shoal:held:"
GATE_HOLDS_KEY = "gate/holds"  # the gate answers a held read of it with "1" at once


def held_read_value(hold_s: float) -> str:
    return (HELD_READ + str(max(0, round(hold_s * 1000))).encode()).decode()


def vote_key(epoch: int, index: int, worker: str) -> str:
    """`worker`'s ballot on the `index`-th voted step of `epoch` (counted from 0 in each
    epoch: every member enters an epoch at the same step and votes on the same steps)."""
    return f"vote/{epoch}/{index}/{worker}"


def decision_key(epoch: int, index: int) -> str:
    return f"decision/{epoch}/{index}"


def _ballot(value: bytes) -> StepBallot | None:
    try:
        return StepBallot.model_validate_json(value)
    except ValueError:
        return None


class RendezvousError(TrainError):
    """The rendezvous store cannot be reached or answered nonsense."""


class RunFailed(TrainError):
    """The membership authority gave up on the run (it cannot make progress)."""


def connect(host: str, port: int, *, is_master: bool = False,
            timeout_s: float = _CONNECT_TIMEOUT_S) -> dist.TCPStore:
    where = f"{host}:{port}"
    if not is_master:
        _wait_until_it_answers(host, port, timeout_s)
    try:
        return dist.TCPStore(host, port, is_master=is_master, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=timeout_s), use_libuv=True)
    except (RuntimeError, dist.DistStoreError) as error:
        said = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise RendezvousError(
            f"cannot {'host' if is_master else 'reach'} the rendezvous store at {where} "
            f"({said}); check that the launcher runs and the port is free and reachable"
        ) from None


def _wait_until_it_answers(host: str, port: int, timeout_s: float) -> None:
    """Wait for something to accept connections at host:port, at most `timeout_s`.

    torch's store client, pointed at a port nothing serves, retries for minutes and then
    raises with its C++ stack; a host started before the serving one waits here instead,
    saying so, and one pointed at the wrong place hears it in plain words."""
    deadline = time.monotonic() + timeout_s
    said_at = time.monotonic()
    while True:
        try:
            socket.create_connection((host, port), timeout=2.0).close()
            return
        except OSError as error:
            now = time.monotonic()
            if now >= deadline:
                raise RendezvousError(
                    f"nothing answers at {host}:{port} after {timeout_s:.0f} s "
                    f"({error.strerror or error}): start the serving host first (one host "
                    "runs with --serve), or check --rendezvous HOST:PORT") from None
            if now - said_at >= 10.0:
                log.info("waiting for the rendezvous at %s:%d (%.0f s left)", host, port,
                         deadline - now)
                said_at = now
        time.sleep(0.2)


class Rendezvous:
    """Typed access to one job's rendezvous store."""

    def __init__(self, store: dist.Store) -> None:
        self.store = store
        self._round_trip_s: float | None = None  # measured when first asked
        self._gate_holds: bool | None = None  # asked when first needed

    def round_trip_s(self) -> float:
        """A round trip to the store (on a LAN well under a millisecond; across a WAN, the
        link's), the least of three: the link, not a busy moment."""
        if self._round_trip_s is None:
            trips = []
            for _ in range(3):
                start = time.monotonic()
                self.store.check(["epoch/latest"])
                trips.append(time.monotonic() - start)
            self._round_trip_s = min(trips)
        return self._round_trip_s

    # -- membership epochs (written by the authority) --------------------

    def publish_epoch(self, record: MembershipEpoch) -> None:
        self.store.set(f"epoch/{record.epoch}", record.model_dump_json())
        self.store.set("epoch/latest", str(record.epoch))

    def read(self, key: str) -> bytes | None:
        """The key's value, or None while it is not set, in one round trip (`get` waits
        for the key, then reads it: two; `check` then `get`: three). It is a
        compare-and-set that cannot change anything: the expected and the new value are
        the same, and not empty (an empty expected value would create the key); the gate
        takes it for the read it is (shoal.elastic.store_wire)."""
        value = self.store.compare_set(key, _ABSENT, _ABSENT)
        return None if value == _ABSENT_BYTES else value

    def gate_holds_reads(self) -> bool:
        """Whether a gate between us and the store holds reads (asked once)."""
        if self._gate_holds is None:
            ask = held_read_value(0)
            self._gate_holds = self.store.compare_set(GATE_HOLDS_KEY, ask, ask) == b"1"
        return self._gate_holds

    def read_held(self, key: str, hold_s: float) -> bytes | None:
        """The key's value once it is set, or None after about `hold_s`, in one round
        trip to the gate, which holds the read (its own wait and read of the store are on
        the job host's loopback); without a holding gate, the store's blocking wait and
        then a read: two."""
        if not self.gate_holds_reads():
            return self.read(key) if self.wait_keys([key], hold_s, block=True) else None
        ask = held_read_value(hold_s)
        value = self.store.compare_set(key, ask, ask)
        return None if value == ask.encode() else value

    def latest_epoch(self) -> int:
        """Newest published epoch number, or -1 before the first."""
        value = self.read("epoch/latest")
        return -1 if value is None else int(value)

    def epoch(self, number: int) -> MembershipEpoch:
        return MembershipEpoch.model_validate_json(self.store.get(f"epoch/{number}"))

    # -- arrivals at an epoch's barrier ----------------------------------

    def arrive(self, epoch: int, arrival: WorkerArrival) -> None:
        self.store.set(f"arrive/{epoch}/{arrival.worker}", arrival.model_dump_json())

    def arrivals(self, epoch: int, members: tuple[str, ...]) -> list[WorkerArrival]:
        values = self.store.multi_get(self.arrival_keys(epoch, members))
        return [WorkerArrival.model_validate_json(v) for v in values]

    def arrival_keys(self, epoch: int, members: tuple[str, ...]) -> list[str]:
        return [f"arrive/{epoch}/{m}" for m in members]

    # -- step votes (each member's own key) and decisions (the authority's) --

    def vote(self, epoch: int, index: int, worker: str, ballot: StepBallot) -> None:
        """Cast `worker`'s ballot on the epoch's `index`-th voted step. A plain set: c10d's
        client sends it and waits for no answer, so the ballot and the wait for the
        decision that follows it cost one round trip, not two. Behind a gate a ballot is
        cast once: the store policy refuses any ballot of a worker that is not newer than
        its last (shoal.elastic.store_policy); a `shoal run` member is trusted."""
        self.store.set(vote_key(epoch, index, worker), ballot.model_dump_json())

    def ballots(self, epoch: int, index: int,
                members: tuple[str, ...]) -> dict[str, StepBallot | None]:
        """Every member's ballot (all must be cast: wait for their keys first); None for
        one that does not parse (a gate refuses those; a `shoal run` member is trusted,
        but a bad ballot must fail its step, not the authority's thread)."""
        values = self.store.multi_get([vote_key(epoch, index, m) for m in members])
        return {m: _ballot(v) for m, v in zip(members, values)}

    def wait_decision(self, epoch: int, index: int, timeout_s: float) -> StepDecision | None:
        """The decision once the authority writes it, waiting up to `timeout_s` (one round
        trip through a market job's gate, two to a store with none: `read_held`)."""
        value = self.read_held(decision_key(epoch, index), timeout_s)
        return None if value is None else StepDecision.model_validate_json(value)

    def decision(self, epoch: int, index: int) -> StepDecision | None:
        value = self.read(decision_key(epoch, index))
        return None if value is None else StepDecision.model_validate_json(value)

    def decide(self, epoch: int, index: int, proposal: StepDecision) -> StepDecision:
        """Write `proposal` unless a decision exists; return the one that stands (the
        authority's deciding thread and its membership thread may both write one)."""
        current = self.store.compare_set(decision_key(epoch, index), "",
                                         proposal.model_dump_json())
        return StepDecision.model_validate_json(current)

    # -- requests from workers to the authority --------------------------

    def _notify(self) -> None:
        index = self.store.add("requests", 1)
        self.store.set(f"request/{index}", "1")  # wakes the authority's watcher

    def wake_watchers(self) -> None:
        """Return a watcher's pending `wait_request` (so a stopping authority can join it)."""
        self._notify()

    def wait_request(self, index: int, timeout_s: float) -> bool:
        return self.wait_keys([f"request/{index}"], timeout_s)

    def requests_seen(self) -> int:
        return self.store.add("requests", 0)

    def request_join(self, worker: str) -> None:
        index = self.store.add("joins", 1)
        self.store.set(f"join/{index}", worker)
        self._notify()

    def joins_since(self, seen: int) -> tuple[int, list[str]]:
        total = self.store.add("joins", 0)
        if total <= seen:
            return seen, []
        names = self.store.multi_get([f"join/{i}" for i in range(seen + 1, total + 1)])
        return total, [n.decode() for n in names]

    def activate(self, worker: str) -> None:
        """Call a warm spare in: it asks to join at once."""
        self.store.set(f"activate/{worker}", "1")

    def wait_activated(self, worker: str, timeout_s: float) -> bool:
        """Block until a launcher calls this spare in (True), at most `timeout_s` (False).
        The store answers the moment the key is set: the spare's join request then lands
        beside the fault it replaces, and the two make one epoch instead of two."""
        return self.wait_keys([f"activate/{worker}"], timeout_s)

    def request_leave(self, worker: str) -> None:
        self.store.set(f"leave/{worker}", "1")
        self._notify()

    def leaving(self, workers: list[str]) -> list[str]:
        return [w for w in workers if self.store.check([f"leave/{w}"])]

    def claim_node(self, node: str) -> int:
        """Claim a host name for worker ids; 1 for the first claim, 2 for the next..."""
        return self.store.add(f"launcher/node/{node}", 1)

    def report_exit(self, worker: str) -> None:
        """A launcher saw this worker's process exit (on any host): drop it now."""
        self.store.set(f"exit/{worker}", "1")
        self.store.add("exits", 1)
        self._notify()

    def exit_count(self) -> int:
        """How many worker processes have exited so far, on every host."""
        return self.store.add("exits", 0)

    def exited(self, workers: list[str]) -> list[str]:
        return [w for w in workers if self.store.check([f"exit/{w}"])]

    # -- liveness and speed ----------------------------------------------

    def beat(self, worker: str, beat: ProgressBeat) -> None:
        """Record a progress point of `worker` (see ProgressBeat)."""
        self.store.set(f"hb/{worker}", beat.model_dump_json())

    def beats(self, workers: list[str]) -> dict[str, ProgressBeat | None]:
        keys = [f"hb/{w}" for w in workers]
        if self.store.check(keys):  # the common case, in two round trips
            return {w: ProgressBeat.model_validate_json(v)
                    for w, v in zip(workers, self.store.multi_get(keys))}
        present = [w for w, k in zip(workers, keys) if self.store.check([k])]
        values = self.store.multi_get([f"hb/{w}" for w in present]) if present else []
        found = {w: ProgressBeat.model_validate_json(v) for w, v in zip(present, values)}
        return {w: found.get(w) for w in workers}

    def report_speed(self, worker: str, samples_per_s: float) -> None:
        self.store.set(f"speed/{worker}", repr(samples_per_s))

    def speeds(self, workers: tuple[str, ...]) -> list[float | None]:
        out = []
        for w in workers:
            key = f"speed/{w}"
            out.append(float(self.store.get(key)) if self.store.check([key]) else None)
        return out

    # -- progress and completion -----------------------------------------

    def report_progress(self, step: int) -> None:
        self.store.set("progress", str(step))

    def progress(self) -> int:
        value = self.read("progress")
        return 0 if value is None else int(value)

    def report_final(self, worker: str, final: dict[str, object]) -> None:
        """`worker` reached the job's last step; `final` holds its figures (`steps`, and
        the reporter's val_loss...). Only the authority ends the job (`mark_done`), once
        every member has finished: no member's word ends it (issue 40, point 1)."""
        self.store.set(f"final/{worker}", json.dumps(final))
        self._notify()

    def final_claims(self, workers: tuple[str, ...]) -> dict[str, dict[str, object]]:
        """The final reports of those of `workers` that wrote one (unparseable: none)."""
        claims = {}
        for worker in workers:
            key = f"final/{worker}"
            if self.store.check([key]):
                try:
                    report = json.loads(self.store.get(key))
                except ValueError:
                    continue
                if isinstance(report, dict):
                    claims[worker] = report
        return claims

    def mark_done(self, reporter: str) -> None:
        """The authority ends the job; `reporter`'s final report is the job's."""
        self.store.set("final_by", reporter)
        self.store.set("done", "1")

    def final(self) -> dict[str, object]:
        """The job's final report (its reporter's, read now: figures it adds after the end,
        such as val_loss, are in it); {} before the end."""
        if not self.store.check(["final_by"]):
            return {}
        claims = self.final_claims((self.store.get("final_by").decode(),))
        return next(iter(claims.values()), {})

    def done(self) -> bool:
        return self.store.check(["done"])

    def mark_failed(self, reason: str) -> None:
        """The authority gives up: every worker stops with `reason`."""
        self.store.set("failed", reason)
        self.store.set("done", "1")

    def failure(self) -> str | None:
        value = self.read("failed")
        return None if value is None else value.decode()

    def check_failed(self) -> None:
        reason = self.failure()
        if reason is not None:
            raise RunFailed(reason)

    def wait_keys(self, keys: list[str], timeout_s: float, block: bool = False) -> bool:
        """True once every key exists; False after `timeout_s` (cancellable loops poll
        this with a few milliseconds). `block`: wait in the store however short the
        wait, for keys that are almost always set long before the timeout runs out
        (a step's votes, its decision: see below for why that matters).

        A short wait asks the store `check` (one request, one answer), never its timed
        `wait`: a wait whose timeout runs out as its keys are set makes torch's TCPStore
        client wait 5 s for a cancel acknowledgement that never comes, then report the keys
        missing (torch 2.13, both server backends; in a 5 ms poll loop, about 1 key in 9
        set at a random moment). A joiner stuck so at the barrier was fenced as stalled,
        re-admitted, and stuck again. Checks come fast at first and then back off, so a
        key set within the first millisecond is seen within a fraction of one, and a
        long wait costs the store no more requests than the old 5 ms waits did.
        A long wait (a watcher's, a spare's) still blocks in the store: its timeout
        runs out rarely, and the race needs a set within a round trip of that moment."""
        if block or timeout_s >= _BLOCKING_WAIT_S:
            try:
                self.store.wait(keys, datetime.timedelta(seconds=timeout_s))
                return True
            except (dist.DistStoreError, RuntimeError):
                return False
        return self._poll(lambda: self.store.check(keys) or None, timeout_s) is not None

    @staticmethod
    def _poll(ask: Callable[[], T | None], timeout_s: float) -> T | None:
        """`ask` until it answers (not None) or `timeout_s` has passed; always asked once,
        however far the store is. Pauses grow from _FIRST_PAUSE_S to _LAST_PAUSE_S."""
        deadline = time.monotonic() + timeout_s
        pause = _FIRST_PAUSE_S
        while True:
            answer = ask()
            if answer is not None:
                return answer
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(pause, left))
            pause = min(pause * _PAUSE_GROWTH, _LAST_PAUSE_S)
