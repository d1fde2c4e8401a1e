"""Which keys of a job's rendezvous store a lease may write (issue 40, points 1,
2 and 6).

Behind the gate, every connection has an identity the coordinator gave it; a
lease's (`lease:N`) may write only what the runtime has that lease's own
workers write, named as the coordinator names them (`AGENT-lN-aA-wI`,
`shoal.spec.worker`), and nothing that the membership authority alone writes:

- its own workers' keys: `arrive/E/W`, `hb/W`, `speed/W`, `leave/W`, `exit/W`,
  `activate/W`, `final/W`, its node's `launcher/node/NODE`, and a `join/I` that
  names one of its workers (each `join/I` once);
- as a member of epoch E: each of its own members' ballots, `vote/E/K/W`, parsing
  as one, each newer than that member's last (so cast once, and never over a
  ballot the authority has read); `state/E`, and the gloo
  keys of its own ranks under `group/E/`; `progress` while it holds rank 0 of
  the newest epoch;
- the counters `requests`, `joins` and `exits`, by one at a time;
- never `epoch/*`, `decision/*`, `done`, `failed`, `final` or `final_by` (the
  authority's), and no key this list does not name.

So a lease cannot end the job, say another lease's worker exited or joined,
mark its speed down, publish a membership, decide a step, or name a resync's
state source (the authority decides every step from the ballots, and picks the
state that stands: shoal.elastic.decider). What a member may still do (send a
state source's moved state when the authority picks it, report its own speed
falsely: shares move only as far as the host's clock confirms,
shoal.elastic.share_moves) is the threat model's open part: see
docs/threat-model.md.

Each value is at most MAX_VALUE_BYTES, and what one lease keeps in the store
at most LEASE_BYTES, so a lease cannot fill the host's memory.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from shoal.elastic.store_wire import Query, Request
from shoal.spec.elastic import ProgressBeat, StepBallot, WorkerArrival
from shoal.spec.worker import WorkerId

# What one lease may keep in the store, all its keys together: an honest lease keeps a
# few hundred bytes per epoch and per step it decides (~150 B), so 64 MiB is ~400,000
# decided steps; a lease that tries to fill the host's memory is cut off there.
LEASE_BYTES = 64 << 20
_LEASE_IDENTITY = re.compile(r"lease:(0|[1-9][0-9]*)")
_AUTHORITY_ONLY = frozenset({"done", "failed", "final", "final_by"})  # and epoch/*, decision/*


def lease_of(identity: str) -> int | None:
    """The lease an identity speaks for (`lease:7` -> 7); None for the operator's own."""
    match = _LEASE_IDENTITY.fullmatch(identity)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class StoreView:
    """What the policies of one gate read of the store (the gate reads it on loopback):
    `members(E)` of a published epoch, None if it is not; `latest()` epoch; and the
    write-once keys written through the gate so far, by any lease."""

    members: Callable[[int], tuple[str, ...] | None]
    latest: Callable[[], int]
    once: set[str] = field(default_factory=set)


@dataclass
class LeasePolicy:
    """One lease's rights in the store; `refusal(request)` says why a request is not
    relayed, or None. Shared by all of the lease's connections (its launcher's, its
    workers'), so its counts are the lease's."""

    lease: int
    epochs: StoreView
    _stored: dict[str, int] = field(default_factory=dict)  # key -> bytes this lease keeps
    _total: int = 0  # sum of _stored
    _latest: int = -1  # the newest epoch this policy has read
    # worker -> (epoch, index) of its newest ballot: a member votes on ever newer steps, so
    # one position per worker holds "once" (a set of every ballot key would only grow).
    _voted: dict[str, tuple[int, int]] = field(default_factory=dict)

    def refusal(self, request: Request) -> str | None:
        if not request.writes:
            return None  # every member reads the whole store (it holds nothing secret)
        if request.query is Query.MULTI_SET:
            for key, value in zip(request.keys, request.values):
                said = self._write(Request(Query.SET, (key,), (value,)))
                if said:
                    return said
            return None
        return self._write(request)

    # -- one key ---------------------------------------------------------------

    def _write(self, request: Request) -> str | None:
        key = request.keys[0].removeprefix("/")  # c10d's client puts '/' before every key
        query = request.query
        if key in _AUTHORITY_ONLY or key.startswith(("epoch/", "decision/")):
            return f"{key!r} is the membership authority's to write"
        parts = key.split("/")
        head = parts[0]
        if query is Query.ADD:
            return self._add(key, parts, request.number or 0)
        if query is Query.COMPARE_SET:
            # The runtime's members write nothing by compare-and-set (its reads that look
            # like one are taken as reads: shoal.elastic.store_wire); the authority does.
            return f"compare-and-set of {key!r}: a lease's worker writes no key so"
        if query is not Query.SET:
            return f"{query.name} is not a write the runtime makes"
        value = request.values[0]
        said = self._rule(head, parts, value)
        return said or self._keep(key, len(value))

    def _rule(self, head: str, parts: list[str], value: bytes) -> str | None:
        if head in _OWN_KEYS and len(parts) == 2:
            return self._own(parts[1]) or _OWN_KEYS[head](value)
        if head == "arrive" and len(parts) == 3:
            said = self._member(parts[1]) or self._own(parts[2])
            if said:
                return said
            try:
                arrival = WorkerArrival.model_validate_json(value)
            except ValidationError:
                return "an arrival that does not parse"
            return None if arrival.worker == parts[2] else "an arrival in another worker's name"
        if head == "join" and len(parts) == 2:
            key = "/".join(parts)
            if key in self.epochs.once:
                return f"{key!r} is written once"
            said = self._own(value.decode(errors="replace"))
            if not said:
                self.epochs.once.add(key)
            return said
        if head == "vote" and len(parts) == 4:
            return self._vote(parts, value)
        if head == "request" and len(parts) == 2:
            return None if value == b"1" else "a request flag other than '1'"
        if head == "state" and len(parts) == 2:
            return self._member(parts[1])
        if head == "group" and len(parts) >= 4:
            return self._gloo(parts)
        if head == "progress" and len(parts) == 1:
            # Rank 0 writes it every step: the newest epoch is read again only when the
            # one seen last does not make this lease rank 0 (a store read per step would
            # stall every lease's relay behind it).
            if self._rank_zero(self._latest) or self._rank_zero(self._newest()):
                return None
            return "progress is rank 0's to write"
        return f"{'/'.join(parts)!r} is no key a lease's worker writes"

    def _add(self, key: str, parts: list[str], amount: int) -> str | None:
        if key in ("requests", "joins", "exits"):
            return None if amount in (0, 1) else f"{key} moves by one at a time"
        if parts[0] == "launcher" and len(parts) == 3 and parts[1] == "node":
            return (self._own(f"{parts[2]}-w0") or
                    (None if amount in (0, 1) else "a node is claimed once at a time"))
        return f"{key!r} is no counter a lease's worker moves"

    def _vote(self, parts: list[str], value: bytes) -> str | None:
        """`vote/E/K/W`: a ballot of one of its own members of E, newer than its last.
        Cast once: a second ballot on a step could change what its decision was made
        from after the authority read it (the ballots stay beside it to be checked)."""
        said = self._member(parts[1]) or self._own(parts[3])
        if said:
            return said
        if not parts[2].isdigit() or len(parts[2]) > 12:
            return f"{parts[2]!r} is not a voted step's number"
        worker, position = parts[3], (int(parts[1]), int(parts[2]))
        if worker not in (self.epochs.members(position[0]) or ()):
            return f"{worker!r} is no member of epoch {parts[1]}"
        if position <= self._voted.get(worker, (-1, -1)):
            return (f"{worker} already voted on epoch {position[0]}'s step {position[1]} "
                    "or a newer one: a ballot is cast once")
        try:
            StepBallot.model_validate_json(value)
        except ValidationError:
            return "a ballot that does not parse"
        self._voted[worker] = position  # (what it keeps is counted by the caller)
        return None

    def _gloo(self, parts: list[str]) -> str | None:
        """gloo's address keys: `group/E/[background/]DEVICE/RANK`, each rank its own."""
        said = self._member(parts[1])
        if said:
            return said
        try:
            rank = int(parts[-1])
        except ValueError:
            return "a gloo key with no rank"
        members = self.epochs.members(int(parts[1])) or ()
        return None if 0 <= rank < len(members) and self._owns(members[rank]) else \
            "another rank's gloo address"

    # -- who is whose ------------------------------------------------------------

    def _newest(self) -> int:
        self._latest = self.epochs.latest()
        return self._latest

    def _rank_zero(self, epoch: int) -> bool:
        members = self.epochs.members(epoch) if epoch >= 0 else None
        return bool(members) and self._owns(members[0])

    def _owns(self, worker: str) -> bool:
        named = WorkerId.leased(worker)
        return named is not None and named.lease == self.lease

    def _own(self, worker: str) -> str | None:
        return None if self._owns(worker) else f"{worker!r} is not a worker of lease {self.lease}"

    def _member(self, epoch: str) -> str | None:
        """None if this lease has a member in published epoch `epoch`."""
        if not epoch.isdigit() or len(epoch) > 12:
            return f"{epoch!r} is not an epoch number"
        members = self.epochs.members(int(epoch))
        if members is None:
            return f"epoch {epoch} is not published"
        return None if any(self._owns(m) for m in members) else \
            f"lease {self.lease} has no member in epoch {epoch}"

    def _keep(self, key: str, size: int) -> str | None:
        total = self._total - self._stored.get(key, 0) + len(key) + size
        if total > LEASE_BYTES:
            return f"lease {self.lease} would keep {total} bytes in the store (at most {LEASE_BYTES})"
        self._stored[key], self._total = len(key) + size, total
        return None


def _flag(value: bytes) -> str | None:
    return None if value == b"1" else "a flag other than '1'"


def _beat(value: bytes) -> str | None:
    """A progress beat the authority can read: one that does not parse would fail every
    tick of the authority that reads it (a lease stopping the job's membership)."""
    try:
        ProgressBeat.model_validate_json(value)
    except ValidationError:
        return "a progress beat that does not parse"
    return None


def _speed(value: bytes) -> str | None:
    try:
        speed = float(value)
    except ValueError:
        return "a speed that is not a number"
    return None if math.isfinite(speed) and speed > 0 else "a speed that is not positive"


def _report(value: bytes) -> str | None:
    try:
        report = json.loads(value)
    except ValueError:
        return "a final report that is not JSON"
    return None if isinstance(report, dict) else "a final report that is not an object"


# A worker's own keys, and what each value must be.
_OWN_KEYS: dict[str, Callable[[bytes], str | None]] = {
    "hb": _beat, "speed": _speed, "leave": _flag, "exit": _flag, "activate": _flag,
    "final": _report,
}
