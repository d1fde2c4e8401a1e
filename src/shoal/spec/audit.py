"""Values that cross the coordinator's API for proof of learning: work
records uploaded by agents, the proof epochs the coordinator roots (and
anchors), the challenges a verifier raises, the verdicts it files, and the
disputes a bonded challenger brings.

Records are commitments: once stored, a record for (job, worker, step) can
never be replaced. What a challenge asks for (a worker's revealed
contribution, or the parameters a step started from) travels as the file
the worker wrote (safetensors); only a verifier's own reader parses it
as tensors.
"""

from __future__ import annotations

import enum

from pydantic import Field

from shoal.spec.base import Frozen
from shoal.spec.worker import WorkerName
from shoal.spec.proof import Ruling, Verdict, WorkRecord

# One upload carries at most this many records; an agent sends the rest next beat.
MAX_RECORDS_PER_UPLOAD = 500
MAX_CHALLENGES_PER_REQUEST = 256
MAX_VERDICTS_PER_FILING = 256


class JobFile(Frozen):
    """A job's file as submitted: what verifiers replay its steps with."""

    job_id: str
    job_file: str


class RecordUpload(Frozen):
    """Work records of the workers on one lease (the agent's own)."""

    lease: int = Field(ge=1, le=2**62)
    records: tuple[WorkRecord, ...] = Field(min_length=1, max_length=MAX_RECORDS_PER_UPLOAD)


class UploadReceipt(Frozen):
    stored: int  # new records
    known: int  # identical to records already stored (a retried upload)


class ProofEpochView(Frozen):
    """One proof epoch of a job, as the coordinator rooted it."""

    epoch: int
    root: str  # 0x-hex Merkle root over the epoch's records in (step, worker) order
    records: int
    complete: bool  # every step of the epoch has records (else rooted when the job moved on)
    chain_epoch: int | None = None  # the anchor's index on the job's chain escrow
    anchored_at_s: float | None = None
    anchor_tx: str | None = None  # the anchoring transaction's hash
    # What the chain holds: `root`, or while forced errors are served, `root` sealed with a
    # salt revealed after the job (shoal.proof.forced.sealed_root).
    anchored_root: str | None = None
    # The epoch's challenge window (coordinator/windows.py): challenges of its files are
    # taken until `challenges_close_at_s` (the coordinator's clock), and `challenges_open`
    # says whether they still were when this view was made.
    challenges_close_at_s: float | None = None
    challenges_open: bool = True


class BlobKind(str, enum.Enum):
    reveal = "reveal"  # what a worker contributed to a step
    params = "params"  # the parameters a step started from
    local = "local"  # under DiLoCo: a worker's own parameters and optimizer state at a step


class ChallengeRequest(Frozen):
    worker: WorkerName
    step: int = Field(ge=0, le=2**62)
    kind: BlobKind = BlobKind.reveal


class Challenges(Frozen):
    items: tuple[ChallengeRequest, ...] = Field(min_length=1, max_length=MAX_CHALLENGES_PER_REQUEST)


class ChallengeView(Frozen):
    """A challenge and whether it was answered; `agent_id` is who must answer it."""

    challenge: int
    job_id: str
    worker: str
    step: int
    kind: BlobKind
    agent_id: str
    requested_at_s: float
    answered_at_s: float | None = None
    sha256: str | None = None  # of the file the agent sent
    holder_offline: bool = False  # its agent is not beating: nobody may answer it soon


class SignedVerdictBody(Frozen):
    """A verdict with its verifier's EIP-191 signature (see shoal.verify.roles.verdicts)."""

    verdict: Verdict
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$")


class VerdictFiling(Frozen):
    verdicts: tuple[SignedVerdictBody, ...] = Field(min_length=1, max_length=MAX_VERDICTS_PER_FILING)


class VerdictView(Frozen):
    seq: int
    at_s: float
    verdict: Verdict
    # What the referee made of a guilty verdict: None (not judged), upheld or rejected.
    ruling: Ruling | None = None


class DisputeFiling(Frozen):
    """A challenger's side of a dispute it opened on the contract (`open_dispute`, with
    its bond, against the provider of `worker`): the state it claims after each of the
    worker's records of proof epoch `epoch`, in step order (index 0: before the first;
    see `shoal.verify.roles.dispute.trajectory`). The coordinator bisects it against
    the worker's own trajectory, and its referee re-executes the one step left."""

    dispute: int = Field(ge=1, le=2**62)  # the dispute's id on chain
    worker: WorkerName
    epoch: int = Field(ge=0, le=2**62)
    # At most 2,000 records (a request body is at most 256 KiB by default).
    trajectory: tuple[str, ...] = Field(min_length=2, max_length=2_001)


class DisputeView(Frozen):
    dispute: int
    job_id: str
    worker: str
    epoch: int
    challenger: str
    provider: str
    filed_at_s: float
    # Where the bisection ended: the step the referee re-executes, after how many rounds.
    step: int | None = None
    rounds: int | None = None
    # "upheld" (the worker cheated at `step`: slashed), "rejected" (the challenger's bond
    # is lost), "undecided" (the referee could not replay: the dispute expires on chain,
    # bond back), or None while the referee has not ruled.
    ruling: Ruling | None = None
    why: str = ""
    tx: str | None = None  # the transaction that moved the money (`resolve_dispute`, or `slash`)
    # The dispute's state on chain once the ruling is enforced there ("upheld", "rejected",
    # "superseded", "expired"); "behind" while it waits for an older dispute on the lease
    # to be decided; None when it is not taken to the chain.
    chain_state: str | None = None
