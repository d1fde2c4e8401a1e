"""A worker entering a membership epoch: arrive at the barrier, build the
epoch's process group, and make sure every member holds the same live state
(sent from a peer, or read from disk when no member has it).

Every wait here gives up as soon as the authority publishes a newer epoch,
so a fault during formation or state transfer just moves everyone on to
the next one.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from shoal.spec.elastic import MembershipEpoch, WorkerArrival
from shoal.train.group import EpochGroup, GroupFailed
from shoal.train.inject import InjectedFaults
from shoal.train.live_state import pack, unpack
from shoal.train.rendezvous import Rendezvous

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Formed:
    group: EpochGroup
    rank: int
    received_state: bool  # state came from a peer (this worker joined or was behind)


def _wait_arrivals(rdzv: Rendezvous, record: MembershipEpoch, poll_s: float,
                   newer: Callable[[], bool]) -> list[WorkerArrival]:
    keys = rdzv.arrival_keys(record.epoch, record.members)
    while not rdzv.wait_keys(keys, poll_s):
        if newer():
            raise GroupFailed(f"epoch {record.epoch} superseded during its barrier")
    return rdzv.arrivals(record.epoch, record.members)


def _plan_transfer(record: MembershipEpoch, arrivals: list[WorkerArrival], rank: int,
                   load_from_disk: Callable[[], bool]) -> tuple[int, list[int]]:
    """(source rank, ranks that receive its state). One member decides every restore."""
    if record.state_source is not None:
        # Replicas were found to differ: the authority named whose state stands.
        source = record.members.index(record.state_source)
        return source, [r for r in range(len(arrivals)) if r != source]
    if record.state_holder is not None:
        named = arrivals[record.members.index(record.state_holder)]
        if named.has_state:  # the authority's pick: members' claims choose nothing
            source = record.members.index(record.state_holder)
            return source, [r for r, a in enumerate(arrivals)
                            if not (a.has_state and a.step == named.step)]
    holders = [a for a in arrivals if a.has_state]
    if not holders:
        # Nobody holds live state: one member alone reads its newest checkpoint (or keeps
        # its fresh initialization) and sends it to all, so every member starts from the
        # same state even if their disks differ or a checkpoint lands meanwhile. It is the
        # member whose disk has the newest (a replacement's agent may have fetched the
        # job's carried checkpoint); rank 0 when no disk has any.
        source = _newest_disk(arrivals)
        if rank == source and not load_from_disk() and record.epoch > 0:
            # Not the job's first epoch: its state left with the last member that held it
            # and no checkpoint of it reached this machine. Say so, loudly: every step is redone.
            log.error("epoch %d: no member holds the job's state and no checkpoint of it is "
                      "here: training starts over from a fresh initialization", record.epoch)
        return source, [r for r in range(len(arrivals)) if r != source]
    best = max(a.step for a in holders)
    source = next(r for r, a in enumerate(arrivals) if a.has_state and a.step == best)
    return source, [r for r, a in enumerate(arrivals) if not (a.has_state and a.step == best)]


def _newest_disk(arrivals: list[WorkerArrival]) -> int:
    """The rank with the newest checkpoint on disk (the lowest such rank); 0 if none has one."""
    steps = [a.disk_step if a.disk_step is not None else -1 for a in arrivals]
    return steps.index(max(steps)) if max(steps) >= 0 else 0


def form_epoch(rdzv: Rendezvous, record: MembershipEpoch, worker: str, *, step: int,
               has_state: bool, disk_step: int | None = None, backend: str, timeout_s: float,
               poll_s: float,
               newer: Callable[[], bool], live_state: Callable[[], dict[str, Any]],
               load_state: Callable[[dict[str, Any]], None],
               load_from_disk: Callable[[], bool],
               group_store: Callable[[], Any], max_state_bytes: int,
               faults: InjectedFaults = InjectedFaults()) -> Formed:
    """Enter `record`; raises GroupFailed/GroupCancelled if it is superseded meanwhile.

    `group_store` opens a store connection of the group's own: a cancelled build
    can leave its connection blocked in a wait, and it must not block ours.
    `max_state_bytes`: the most a peer's live state may announce (and take) here."""
    rank = record.members.index(worker)
    rdzv.arrive(record.epoch, WorkerArrival(worker=worker, step=step, has_state=has_state,
                                            disk_step=disk_step))
    arrivals = _wait_arrivals(rdzv, record, poll_s, newer)
    group = EpochGroup.build(group_store(), record.epoch, rank, len(record.members),
                             backend=backend, timeout_s=timeout_s, poll_s=poll_s,
                             should_cancel=newer)
    try:
        source, needers = _plan_transfer(record, arrivals, rank, load_from_disk)
        if needers:
            _transfer(rdzv, group, record.epoch, rank, source, poll_s, newer, live_state, load_state,
                      max_state_bytes,
                      faults)
        return Formed(group, rank, rank in needers)
    except Exception:
        group.abandon()
        raise


def _transfer(rdzv: Rendezvous, group: EpochGroup, epoch: int, rank: int, source: int,
              poll_s: float, newer: Callable[[], bool],
              live_state: Callable[[], dict[str, Any]],
              load_state: Callable[[dict[str, Any]], None], limit: int,
              faults: InjectedFaults) -> None:
    """Broadcast the source's packed state; receivers verify its hash before loading."""
    key = f"state/{epoch}"
    if rank == source:
        state = live_state()
        packed = pack(state)
        rdzv.store.set(key, json.dumps({"sha256": packed.sha256, "bytes": packed.blob.numel()}))
        if faults.dies_sending_state(state["step"]):
            log.warning("injected fault: dying while sending state in epoch %d", epoch)
            os._exit(137)
        group.broadcast(packed.blob.to(group.device), source, newer)
        return
    while not rdzv.wait_keys([key], poll_s):
        if newer():
            raise GroupFailed(f"epoch {epoch} superseded before its state transfer")
    header = json.loads(rdzv.store.get(key))
    size = header.get("bytes") if isinstance(header, dict) else None
    if not isinstance(size, int) or not 0 < size <= limit:
        # Before anything is allocated: a source announcing a terabyte would take every
        # joiner down (issue 40, point 3).
        raise GroupFailed(f"the state source of epoch {epoch} announced {size!r} bytes of "
                          f"state (at most {limit} for this model); refused")
    blob = torch.empty(size, dtype=torch.uint8, device=group.device)
    group.broadcast(blob, source, newer)
    try:
        state = unpack(blob.cpu(), str(header.get("sha256")), limit)
    except ValueError as error:
        raise GroupFailed(str(error)) from None
    load_state(state)
    log.info("received live state (%d bytes, sha256 %s) from rank %d",
             header["bytes"], header["sha256"][:12], source)
