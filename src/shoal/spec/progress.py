"""How a market job is doing, as the coordinator shows it: each committed
step's loss and pace (sent by the agent of the step's rank 0), and the
membership epochs its job host formed."""

from __future__ import annotations

from pydantic import Field

from shoal.spec.base import Frozen
from shoal.spec.worker import WorkerName
from shoal.spec.plan import Codec, SyncMode

MAX_STEPS_PER_UPLOAD = 2000


class StepProgress(Frozen):
    step: int = Field(ge=0, le=2**62)
    t: float  # wall time the step committed
    loss: float | None = None  # the step's global mean training loss (None: the guard skipped it)
    world: int = Field(ge=1, le=1_000_000)
    samples: int = Field(ge=0, le=2**40)  # the step's global batch


class ProgressUpload(Frozen):
    """Committed steps of a lease's worker while it was rank 0."""

    lease: int = Field(ge=1, le=2**62)
    worker: WorkerName
    steps: tuple[StepProgress, ...] = Field(min_length=1, max_length=MAX_STEPS_PER_UPLOAD)


class MembershipChange(Frozen):
    t: float
    epoch: int
    members: tuple[str, ...]
    reason: str = ""
    # The member whose state every other member adopted as the epoch formed (a resync's,
    # a join's), as the job's host published it: a break in the chain of steps at the
    # epoch's first step falls on it (shoal.proof.chain).
    state_source: str | None = None


class JobPlanView(Frozen):
    """What the planner made of a job's members at one membership epoch."""

    t: float  # when the coordinator planned it
    epoch: int  # the membership epoch planned for
    members: tuple[str, ...]
    dp: int = Field(ge=1)
    pp: int = Field(ge=1)
    mode: SyncMode
    inner_steps: int = Field(ge=1)
    codec: Codec
    slt: int = Field(0, ge=0)  # DiLoCo rounds applied this many outer steps late
    step_time_s: float = Field(ge=0.0)  # predicted for that mode, codec and slt
    compute_s: float = Field(ge=0.0)
    exchange_s: float = Field(ge=0.0)  # per optimizer step (amortized over inner steps)
    unused: tuple[str, ...] = ()
    links: str  # "probed": from the coordinator's probes of each agent; else region defaults
    advice: str = ""  # set when the planner would synchronize otherwise than the job does
    measured_step_s: float | None = None  # median of the job's steps since (on read)
