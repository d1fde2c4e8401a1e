"""Proof of learning: the values a worker commits to for every step, what an
audit concludes, and how a job is audited.

A `WorkRecord` binds everything a replay needs (the parameters the step
started from, the stream positions of its samples, the data seed, the
hyperparameters) to a commitment to what the worker contributed, so that
an audit compares one replay against one commitment and no party can
choose its data, seeds or settings after the fact.
"""

from __future__ import annotations

import enum
import hashlib
import json

from pydantic import Field

from shoal.spec.base import Frozen
from shoal.spec.worker import WorkerName

SHA256_HEX = r"^[0-9a-f]{64}$"


class LocalStep(Frozen):
    """Under DiLoCo, what a worker's record of a step claims beyond the common fields.

    Inside a round each worker steps its own optimizer on its own replica, so a step
    starts from this worker's parameters (`WorkRecord.params_sha256`) and optimizer
    state, not from what every replica holds. The claims chain: a step starts where
    the worker's previous step of the round ended, or at the round's agreed start
    (theta_outer); its end is what the optimizer makes of its start and its committed
    gradient. The round's last step also commits the pseudo-gradient it sent."""

    round_start: int = Field(ge=0)  # the round's first step: it starts from theta_outer
    state_sha256: str = Field(pattern=SHA256_HEX)  # the optimizer state the step started from
    applied: bool  # the optimizer stepped (the worker's own guard let the step through)
    end_params_sha256: str = Field(pattern=SHA256_HEX)  # after the step
    end_state_sha256: str = Field(pattern=SHA256_HEX)
    # The round's last step: the samples behind this worker's pseudo-gradient and the
    # round's (it is weighted by their ratio), and the pseudo-gradient's norm. The
    # pseudo-gradient is the last tensor of the committed contribution.
    round_samples: int | None = Field(None, ge=0)
    round_expected: int | None = Field(None, ge=1)
    outer_norm: float | None = Field(None, ge=0.0)

    @property
    def outer(self) -> bool:
        return self.round_expected is not None


class Exchanged(Frozen):
    """What the members of a voted step declared they sent, as every member read it.

    An all-reduce shows nobody what one member sent, only the sum. So after it, each
    member publishes a sketch of its own part: its projection on random directions
    drawn from the hash of the exchanged sum (fixed only once every part was sent),
    and the step is applied only if the sketches add up to the sum's. A worker that
    sends other than it commits must then either declare the sketch of what it sent,
    which a replay of its committed work does not match, or have the step refused."""

    seed: str = Field(pattern=SHA256_HEX)  # SHA-256 of the exchanged sum: draws the directions
    # Per rank, in rank order; None where a value is not finite (a NaN step's).
    sketches: tuple[tuple[float | None, ...], ...] = Field(min_length=1)
    # DiLoCo round ends: the samples each rank's pseudo-gradient is weighted by, which
    # the outer average is normalised with.
    counts: tuple[int, ...] | None = None
    # Per rank, the loss it reported for the guard's spike check, summed in the same
    # all-reduce: the sum of its micro-batches' losses times their sizes (None where not
    # finite), and how many samples that covers (0: it reported none). A replay of its
    # step recomputes both.
    losses: tuple[float | None, ...] | None = None
    loss_samples: tuple[int, ...] | None = None


class WorkRecord(Frozen):
    """One worker's claim about one step: what it started from, on which
    samples, and a commitment to the contribution it sent."""

    job: str = Field(min_length=1, max_length=128)
    step: int = Field(ge=0)  # the step this contribution is for (0-based)
    worker: WorkerName
    params_sha256: str = Field(pattern=SHA256_HEX)  # parameters the step started from
    # Stream positions [start, end) of this worker's samples (see shoal.train.order);
    # with the data seed they name the exact sample ids.
    positions_start: int = Field(ge=0)
    positions_end: int = Field(ge=0)
    # The step's split of the global batch, in rank order, and this worker's rank:
    # its positions must be exactly its rank's slice (a copier's cannot be).
    rank: int = Field(ge=0)
    shares: tuple[int, ...] = Field(min_length=1)
    seed: int = Field(ge=0)  # the job's data seed (permutation of the stream)
    global_batch: int = Field(ge=1)  # every micro-batch's gradient is weighted chunk / global_batch
    micro_batch: int | None = Field(None, ge=1)  # how the share was split into forward passes
    hyper_sha256: str = Field(pattern=SHA256_HEX)  # the job's hyperparameters (hyper_digest)
    contribution_sha256: str = Field(pattern=SHA256_HEX)  # what the worker sent, bit for bit
    # Its l2 norm (cheap screening, never a verdict); None when it is not finite (a NaN
    # loss: the guard skips the step, and the record still says what was sent).
    contribution_norm: float | None = Field(ge=0.0)
    # Seeds the step's own randomness (dropout): derived from the job seed, the step
    # and the first position, so nobody picks it.
    rng_seed: int = Field(ge=0)
    # The membership epoch the step committed in. A step is committed once per lineage;
    # it is committed again only after the job's state was lost and restored from a
    # checkpoint, in a later epoch, and then only the newest epoch's records of the step
    # describe the model that went on, if they show a commit of that epoch
    # (`shoal.proof.epochs.final_lineage`).
    membership_epoch: int = Field(0, ge=0)
    local: LocalStep | None = None  # under DiLoCo (sync.mode = "diloco"), else None
    # A voted step (every step; under DiLoCo a round's end): what its members declared
    # they sent. None on a DiLoCo inner step, which exchanges nothing.
    exchanged: Exchanged | None = None
    # The parameters after the step as applied (its update, a skip, a rollback; under
    # DiLoCo, at a round's end, after the outer step): the next step must start there
    # (`shoal.proof.chain`), so a state injected between steps breaks the chain.
    end_sha256: str | None = Field(None, pattern=SHA256_HEX)
    # The guard rolled the replica back at this step, to the state step N started from
    # (its last good one): the step's end must then be that state.
    rolled_back_to: int | None = Field(None, ge=0)

    @property
    def contributed(self) -> bool:
        """Something other than zeros was sent (a non-finite contribution counts)."""
        return self.contribution_norm is None or self.contribution_norm > 0

    @property
    def plantable(self) -> bool:
        """A forced error may stand in for it: no other record's audit reads its files.
        Under DiLoCo a round's end re-reads its round's earlier steps, so only a round's
        end is (a plant inside a round would fail the round's real end)."""
        return self.local is None or self.local.outer

    @property
    def samples(self) -> int:
        return self.positions_end - self.positions_start

    def leaf(self) -> bytes:
        """The Merkle leaf: SHA-256 of the record's canonical JSON, domain-separated
        from inner nodes (a leaf can never pass for a node)."""
        # A field added later hashes as if it did not exist while it is unset.
        unset: dict[str, object] = {name: True for name in _LATE_FIELDS
                                    if getattr(self, name) is None}
        if self.exchanged is not None:
            late = {n for n in ("losses", "loss_samples") if getattr(self.exchanged, n) is None}
            if late:
                unset["exchanged"] = late
        body = json.dumps(self.model_dump(mode="json", exclude=unset or None),
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(b"\x00" + body.encode()).digest()


# Fields added after the first records were hashed: while unset, a leaf is as before.
_LATE_FIELDS = ("local", "exchanged", "end_sha256", "rolled_back_to")


def hyper_digest(hyperparameters: dict[str, object]) -> str:
    """SHA-256 of a job's hyperparameters as canonical JSON (what records bind)."""
    body = json.dumps(hyperparameters, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


class VerdictKind(str, enum.Enum):
    valid = "valid"  # the replay matches the revealed contribution, which matches its commitment
    wrong_contribution = "wrong_contribution"  # replay and revealed contribution differ
    bad_commitment = "bad_commitment"  # the revealed contribution is not what was committed
    bad_proof = "bad_proof"  # the record is not in the anchored tree
    wrong_params = "wrong_params"  # the record claims a start the job never had
    withheld = "withheld"  # the worker did not reveal its contribution in time
    wrong_samples = "wrong_samples"  # positions outside its step, or overlapping another record
    wrong_loss = "wrong_loss"  # the loss it reported to the guard is not its samples' loss
    unavailable = "unavailable"  # the step's parameters could not be had: no verdict on the worker


class Ruling(enum.StrEnum):
    """What the referee made of a guilty verdict or a dispute (stored, logged and
    formatted as its value)."""

    upheld = "upheld"  # the worker cheated: its provider is slashed
    rejected = "rejected"  # the accusation is false: the accuser pays (bond, or a penalty)
    undecided = "undecided"  # the referee could not tell: nobody pays
    plant = "plant"  # the accused record is a forced error the coordinator served: not ruled
    # A verdict on a planted error: what it says of the verifier that filed it.
    plant_caught = "plant_caught"
    plant_missed = "plant_missed"
    plant_abstained = "plant_abstained"
    plant_late = "plant_late"  # filed once the plants were revealed: it tells nothing
    # A challenge answered after the verdict was filed: the referee replays instead.
    # Only passed between the referee's steps, never stored.
    answered_late = "answered_late"


GUILTY = frozenset({VerdictKind.wrong_contribution, VerdictKind.bad_commitment,
                    VerdictKind.bad_proof, VerdictKind.wrong_params, VerdictKind.withheld,
                    VerdictKind.wrong_samples, VerdictKind.wrong_loss})


class Verdict(Frozen):
    """A verifier's conclusion on one record (signed and recorded by the control layer)."""

    job: str
    epoch: int = Field(ge=0)  # the proof epoch whose root the record is under
    step: int = Field(ge=0)
    worker: str
    kind: VerdictKind
    distance: float | None = None  # relative l2 distance of replay and revealed contribution
    tolerance: float | None = None  # the bound it was held to
    verifier: str = ""  # the verifier's address (or name, off chain)
    detail: str = ""

    @property
    def guilty(self) -> bool:
        return self.kind in GUILTY


class ProofSpec(Frozen):
    """How a job is recorded and audited (the job file's `[proof]` section)."""

    enabled: bool = False
    # Steps per proof epoch (one Merkle root). Every worker is audited at least once per
    # epoch, so longer epochs audit a smaller share: 50 keeps it near 2% for 4 workers.
    epoch_steps: int = Field(50, ge=1, le=1_000_000)
    audit_rate: float = Field(0.02, gt=0.0, le=1.0)  # share of an epoch's records replayed
    min_audits_per_worker: int = Field(1, ge=0, le=1000)  # every worker audited each epoch
    # The challenge window. Run alone, a worker keeps a step's files for `keep_epochs` proof
    # epochs and at least `keep_s` seconds after it committed, so a fast job does not prune
    # them before a verifier can ask (disk: the larger of the two spans' steps). Under a
    # coordinator the window is the coordinator's, not the worker's: it takes challenges of
    # an epoch's files until `keep_s` seconds after it served the epoch to verifiers, and
    # refuses them after; the agent runs its workers with `prune = false` and drops the
    # files itself once the window closed (a worker pruning on its own clock could be
    # challenged after its files were gone, and be slashed for withholding them).
    keep_epochs: int = Field(2, ge=1, le=1000)
    keep_s: float = Field(60.0, ge=0.0, le=7 * 86400.0)
    prune: bool = True  # false: the worker keeps every step's files (someone else prunes)
    # Relative l2 distance (replay vs revealed) under which a contribution is honest;
    # profiled from honest re-runs (README, "Proof of learning").
    tolerance: float = Field(1e-3, gt=0.0, lt=1.0)
    dir: str = Field("runs/{name}/proof", min_length=1)
