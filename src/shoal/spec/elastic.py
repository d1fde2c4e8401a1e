"""Values the elastic runtime passes between the launcher, the membership
authority and the workers (through the rendezvous store), and what it reports.
"""

from __future__ import annotations

import enum

from pydantic import Field

from shoal.spec.job import Frozen
from shoal.spec.worker import WorkerName


class BatchPolicy(str, enum.Enum):
    # The global batch stays fixed whatever the world size; shares change.
    invariant = "invariant"
    # Each worker keeps its batch; the global batch and the LR scale with the world.
    linear = "linear"


class WorkerArrival(Frozen):
    """What a worker says when it arrives at an epoch's barrier."""

    worker: WorkerName
    step: int = Field(ge=0)  # steps this worker's state has completed (0 for a fresh joiner)
    has_state: bool  # holds the job's live state (a fresh or fenced joiner does not)
    # The newest checkpoint on this worker's disk (its own, or one its agent fetched):
    # when no member holds live state, the member with the newest restores it for all.
    disk_step: int | None = Field(None, ge=0)


class MembershipEpoch(Frozen):
    """One membership decision of the authority: who is in, in rank order."""

    epoch: int = Field(ge=0)
    members: tuple[WorkerName, ...]  # worker ids; index = rank in this epoch's process group
    weights: tuple[float, ...]  # share weights (measured speed), same order as members
    # Who needs state, and whether it comes from disk, the members work out from
    # their arrivals at the epoch's barrier (see shoal.train.membership).
    reason: str = ""  # why this epoch exists: start, kill, stall, leave, join, rebalance
    # Set when replicas were found to differ: every other member adopts this one's state.
    state_source: str | None = None
    # Otherwise, the member whose live state a member without it (a joiner) takes: one
    # that held the job's state through every epoch since the authority last decided a
    # step (all such members hold the same). None when none did (the start, a restore).
    # So no member becomes the source by claiming to be furthest (issue 40, point 6).
    state_holder: str | None = None


class Phase(int, enum.Enum):
    """How far a member has got within an epoch; the authority fences laggards."""

    arrived = 0  # at the epoch's barrier
    exchange = 1  # its share of a step is computed; in the gradient exchange
    voted = 2  # voted on the step
    stepped = 3  # took a step with nothing to agree on (a DiLoCo inner step: no exchange, no vote)
    finished = 4  # committed the job's last step and reported its final figures


class ProgressBeat(Frozen):
    """A member's last progress point, written to the store as it makes progress.

    Liveness is progress, not a thread that beats: a member hung in its data
    loader writes nothing, so the authority sees it fall behind its peers.
    """

    epoch: int
    count: int = Field(ge=0)  # progress points reached in this epoch (arrival = 1)
    step: int = Field(ge=0)
    phase: Phase
    # The voted steps this member has passed in this epoch: its point lies on the way to
    # the next one (the authority, which decides every vote, knows how many there were:
    # shoal.elastic.liveness never takes a member's word for being further than that).
    vote: int = Field(0, ge=0)
    # Refreshes while waiting on peers at this point (a barrier, an exchange): they
    # show the member can still reach the store, so one that cannot (partitioned,
    # frozen) stands out even when every member waits at the same point.
    waits: int = Field(0, ge=0)
    # The round trip from the member to the store, as its reporter measured it: a report
    # across a WAN, queued behind a bulk exchange, can take many of them to land.
    rtt_s: float | None = Field(None, ge=0)


class GuardVerdict(str, enum.Enum):
    apply = "apply"
    skip = "skip"  # do not apply this step
    rollback = "rollback"  # do not apply, and restore the last good state


class StepBallot(Frozen):
    """One member's vote on one voted step of an epoch, at `vote/E/K/W`: a key of its own,
    written once (a gate refuses a second), so anyone can check the authority's
    decision against the ballots it was made from (issue 40, point 6)."""

    step: int = Field(ge=0)  # the step the member exchanged (every member's must agree)
    ok: bool  # its exchange (and, with work records, the sent check) succeeded
    verdict: GuardVerdict = GuardVerdict.apply  # its guard's assessment of the reduced step
    # Its own replica fingerprint, as it put it in the exchange (None when the exchange
    # failed): the authority finds divergence, and whose state stands, from these.
    fingerprint: int | None = Field(None, ge=0)
    rebalance: bool = False  # the step closes a rebalance interval: new weights are due


class StepDecision(Frozen):
    """The outcome of one voted step, written once by the membership authority."""

    commit: bool
    next_epoch: int | None = None  # switch to this epoch after applying (or discarding) the step
    weights: tuple[float, ...] | None = None  # new shares from the next step on (same epoch)
    # What every member does with a committed step: the strictest verdict any member
    # reached, so a rollback happens everywhere or nowhere.
    verdict: GuardVerdict = GuardVerdict.apply
    # Replica fingerprints differed: the step is discarded and every member adopts
    # this worker's state in the next epoch.
    resync_from: str | None = None


class StepRecord(Frozen):
    """One committed step, as each worker logs it (JSON lines in the run directory)."""

    step: int  # 0-based index of the step that committed
    epoch: int
    worker: str
    rank: int
    world: int
    cursor: int  # stream position of the step's first sample
    shares: tuple[int, ...]  # samples per rank; positions are cursor + prefix sums
    t_start: float  # wall time (time.time()) the committed attempt started computing
    t_commit: float  # wall time the step was applied
    loss: float | None  # global mean loss of the step (None if the guard skipped it)
    applied: bool = True  # False when the guard skipped the update (NaN, spike)
    param_sha256: str | None = None  # replica fingerprint after the step, when checked
    # Exchange bytes this worker has put on the wire so far (ring model, failed attempts too).
    bytes_sent: int | None = None
    # DiLoCo outer steps: samples the round committed whose inner work no member present
    # brought to the outer step (it was lost with a member).
    samples_dropped: int = 0
    # Bounded-staleness DiLoCo ([sync] slt): of the rounds applied at this step, the most
    # outer steps between the start of a round's exchange and its application (None:
    # none applied here), how many were late (> 0), and rounds abandoned in flight
    # (a membership change) since the step before.
    slt_seen: int | None = None
    rounds_late: int = 0
    rounds_dropped: int = 0


class FaultKind(str, enum.Enum):
    kill = "kill"
    stall = "stall"
    leave = "leave"
    join = "join"
    # A worker that ended on its own, unasked: a crash, an out-of-memory kill, a kill from
    # outside the launcher (the others are what --chaos injects).
    exit = "exit"


class FaultReport(Frozen):
    kind: FaultKind
    worker: str | None
    t: float  # seconds since the run started
    detection_s: float | None  # fault until the authority published a new membership
    recovery_s: float | None  # RTO: fault until steps run at >= 90% of the steady rate
    steps_lost: int  # committed steps undone by the fault (0 unless state was lost)


class ElasticReport(Frozen):
    """What `shoal run` / `shoal train --workers` writes with --report."""

    steps: int
    faults: tuple[FaultReport, ...]
    epochs: int
    samples_seen: int
    samples_skipped: int
    samples_duplicated: int
    guard_skipped_steps: int
    replica_mismatches: int
    replica_checks: int
    throughput_samples_per_s: float
    eta_het: float | None
    wall_s: float
    param_sha256: str | None  # of the final parameters, as in the single-worker report
    train_loss: float | None = None  # mean global loss of the last 20 applied steps
    val_loss: float | None = None  # when the worker program reports one
    # Every figure the program published (run.publish_final(name=value, ...)), val_loss
    # among them: numbers, strings and booleans.
    published: dict[str, float | int | str | bool | None] = Field({}, max_length=64)
    # Samples seen in committed steps whose gradient work never reached the model: a
    # DiLoCo member lost mid-round takes its inner work with it (0 for every-step sync).
    samples_dropped: int = 0
    # Bounded-staleness DiLoCo ([sync] slt = k): the most outer steps a round's average
    # was applied after its exchange started (k, or less at the run's end; None when no
    # round was applied late), the rounds applied late, and those abandoned in flight.
    slt_seen: int | None = None
    rounds_late: int = 0
    rounds_dropped: int = 0
