"""The job specification: what to train, on what data, for how long.

A job file (TOML) maps onto `JobSpec` one section per component; every
value is validated here, once, so the runtime can trust what it receives.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from shoal.spec.base import Frozen
from shoal.spec.bundle import SHA256
from shoal.spec.plan import Codec, SyncMode
from shoal.spec.proof import ProofSpec

BYTE_VOCAB = 256  # byte-level models: one token per byte, no tokenizer to ship


class ModelSpec(Frozen):
    """A decoder-only transformer over bytes (nanoGPT shape)."""

    kind: str = Field("gpt", pattern="^gpt$")
    layers: int = Field(4, ge=1, le=64)
    heads: int = Field(4, ge=1, le=64)
    width: int = Field(128, ge=8, le=8192)
    context: int = Field(128, ge=8, le=8192)
    dropout: float = Field(0.0, ge=0.0, le=0.9)

    def parameters(self) -> int:
        """The model's parameter count (shoal.models.model.GPT), by arithmetic: byte and
        position embeddings, per layer two LayerNorms, attention (qkv, proj) and the MLP
        (12 d^2 + 13 d), a final LayerNorm; the head shares the byte embedding."""
        d = self.width
        return (256 + self.context) * d + self.layers * (12 * d * d + 13 * d) + 2 * d

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSpec:
        if self.width % self.heads:
            raise ValueError(
                f"model.width ({self.width}) must be a multiple of model.heads ({self.heads})"
            )
        return self


class DataSpec(Frozen):
    """Where the bytes come from and how they are split."""

    # "stdlib": the .py files of the running Python's standard library
    # (shipped with every installation, so nothing is downloaded).
    # Otherwise a path to a text file or a directory of text files.
    corpus: str = Field("stdlib", min_length=1)
    # For a directory corpus: which file name endings to read.
    suffixes: tuple[str, ...] = (".py", ".txt", ".md", ".rst")
    val_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    # Cap on corpus bytes read (in a fixed file order), to bound start-up time.
    max_bytes: int | None = Field(None, ge=4096)


class OptimizerKind(str, enum.Enum):
    adamw = "adamw"
    sgd = "sgd"


class OptimizerSpec(Frozen):
    kind: OptimizerKind = OptimizerKind.adamw
    lr: float = Field(1e-3, gt=0.0, le=10.0)
    weight_decay: float = Field(0.1, ge=0.0, le=1.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.99, ge=0.0, lt=1.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)  # sgd only
    grad_clip: float = Field(1.0, ge=0.0, le=1e6)  # 0 disables clipping


class ScheduleKind(str, enum.Enum):
    constant = "constant"
    cosine = "cosine"
    linear = "linear"


class ScheduleSpec(Frozen):
    """Learning rate over steps: linear warm-up, then `kind` down to min_lr_ratio×lr."""

    kind: ScheduleKind = ScheduleKind.cosine
    warmup_steps: int = Field(50, ge=0, le=10_000_000)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)


class Precision(str, enum.Enum):
    fp32 = "fp32"
    # bfloat16 autocast for the forward pass; parameters, gradients and the
    # optimizer stay float32.
    bf16 = "bf16"


class Aggregation(str, enum.Enum):
    """How the workers' contributions to a step are combined."""

    mean = "mean"  # the plain (share-weighted) mean: exact, one all-reduce
    # Byzantine-robust rules over per-worker gradients (an all-gather): one
    # cheat in a step cannot steer the model between audits.
    trimmed_mean = "trimmed_mean"
    median = "median"
    centered_clip = "centered_clip"
    multi_krum = "multi_krum"  # drops whole workers: the n - f nearest to the others stay
    distance_filter = "distance_filter"  # drops whole workers far from the median


class SyncSpec(Frozen):
    """How replicas synchronize (`[sync]`); the defaults are plain every-step all-reduce.

    The names are the planner's (`shoal plan` answers a mode, inner steps and a codec).
    """

    mode: SyncMode = SyncMode.allreduce
    # DiLoCo (Douillard et al. 2023): inner optimizer steps between outer steps (H).
    inner_steps: int = Field(1, ge=1, le=100_000)
    # The outer optimizer over averaged pseudo-gradients: SGD with Nesterov momentum
    # (DiLoCo's 0.7 and 0.9; with codec "sparseloco", SparseLoCo's 1.0 and none, see below).
    outer_lr: float = Field(0.7, gt=0.0, le=10.0)
    outer_momentum: float = Field(0.9, ge=0.0, lt=1.0)
    # What is exchanged (gradients every step, or pseudo-gradients at outer steps) is
    # compressed with error feedback: the part not sent joins the next contribution.
    codec: Codec = Codec.none
    topk_fraction: float = Field(0.01, gt=0.0, lt=1.0)  # share of entries top-k keeps
    powersgd_rank: int = Field(4, ge=1, le=1024)
    # Bounded staleness (DiLoCo only): a round's averaged pseudo-gradient is exchanged in
    # the background and applied exactly `slt` outer steps later, so a slow link stalls
    # nobody; 0 waits for the average at the outer step (shoal.train.sync.staleness).
    slt: int = Field(0, ge=0, le=16)

    @model_validator(mode="before")
    @classmethod
    def _sparseloco_outer_defaults(cls, data: object) -> object:
        """SparseLoCo (Sarfi et al. 2025) averages without outer momentum at lr 1: its
        error feedback already carries what earlier rounds did not send, and momentum on
        top of it overshoots (bench/local_rounds.py, the tiny GPT, 4 workers, H = 10, 300
        steps, uncompressed: plain averaging ended 2.152 nats, DiLoCo's 0.7 with Nesterov
        0.9 2.365). Settings the job gives are kept."""
        if isinstance(data, dict) and data.get("codec") == Codec.sparseloco:  # a str enum
            data = {"outer_lr": 1.0, "outer_momentum": 0.0, **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SyncSpec:
        if self.mode is SyncMode.allreduce and self.inner_steps != 1:
            raise ValueError(f"sync.inner_steps = {self.inner_steps} applies to mode = "
                             "'diloco' only; set mode = 'diloco' or drop inner_steps")
        if self.mode is SyncMode.diloco and self.inner_steps < 2:
            raise ValueError("sync.mode = 'diloco' needs inner_steps >= 2 (1 is every-step "
                             "all-reduce with an extra optimizer; use mode = 'allreduce')")
        if self.slt > 0 and self.mode is not SyncMode.diloco:
            raise ValueError(f"sync.slt = {self.slt} delays DiLoCo's outer steps; every-step "
                             "all-reduce has none to delay: set mode = 'diloco' (with "
                             "inner_steps) or drop slt")
        if self.slt > 0 and self.codec is Codec.powersgd:
            # PowerSGD exchanges in two dependent all-reduces (P, then Q from it), which
            # cannot run in the background beside the inner steps' votes; int8 and top-k
            # are one all-gather each.
            raise ValueError(f"sync.slt = {self.slt} exchanges the pseudo-gradient in the "
                             "background; codec = 'powersgd' cannot run there: use 'int8' or "
                             "'topk' with slt, or slt = 0")
        return self


class CheckpointSpec(Frozen):
    # Relative paths are resolved against the working directory;
    # "{name}" is replaced by the job name.
    dir: str = Field("runs/{name}/checkpoints", min_length=1)
    interval_steps: int = Field(100, ge=1, le=10_000_000)
    keep: int = Field(3, ge=1, le=1000)


# A variable a bundled job's script is given (`[bundle] env`): a plain name, never one of
# the runtime's own (SHOAL_*) or one that changes how Python or the loader start.
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_ENV_RESERVED = ("SHOAL_", "PYTHON", "LD_", "TORCH_", "OMP_", "PATH", "HOME")


class BundleRef(Frozen):
    """`[bundle]`: the job is the submitter's own script, packed by `shoal bundle` (or
    `shoal submit SCRIPT`) into the archive whose SHA-256 this is. Every provider, and
    whoever checks its work, runs exactly that archive's script with `args`.

    `env`: variables the script is given, such as the endpoint of the data's store. They
    are in the job file, which anyone may read: a credential goes in the submission's
    `secret_env` instead (sent to each lease's provider alone, while the lease runs).
    """

    sha256: SHA256
    args: tuple[Annotated[str, Field(max_length=1024)], ...] = Field((), max_length=64)
    env: dict[str, Annotated[str, Field(max_length=4096)]] = Field({}, max_length=32)

    @field_validator("env")
    @classmethod
    def _plain_names(cls, env: dict[str, str]) -> dict[str, str]:
        return script_env(env, "bundle.env")


def script_env(env: dict[str, str], where: str) -> dict[str, str]:
    """`env`, if a bundled job's script may be given each of its variables."""
    for name in env:
        if not _ENV_NAME.fullmatch(name) or name.startswith(_ENV_RESERVED):
            raise ValueError(f"{where}: {name!r} cannot be set for a job's script "
                             "(upper-case letters, digits and '_'; none of "
                             f"{', '.join(p + '*' for p in _ENV_RESERVED)})")
    return env


class JobSpec(Frozen):
    """One training job, as read from a job file."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] = "job"
    seed: int = Field(0, ge=0, le=2**62)
    steps: int = Field(ge=1, le=100_000_000)
    global_batch: int = Field(ge=1, le=1 << 20)
    eval_interval: int = Field(100, ge=1, le=100_000_000)
    eval_batches: int = Field(8, ge=1, le=10_000)  # validation windows: eval_batches × global_batch
    # Most samples per forward pass (gradients accumulate over the rest);
    # None: a worker's whole share at once. Bounds memory, not the math.
    micro_batch: int | None = Field(None, ge=1, le=1 << 20)
    precision: Precision = Precision.fp32
    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    schedule: ScheduleSpec = ScheduleSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    aggregation: Aggregation = Aggregation.mean
    proof: ProofSpec = ProofSpec()
    sync: SyncSpec = SyncSpec()
    # The submitter's own script (None: the built-in GPT as [model] and [data] say).
    bundle: BundleRef | None = None

    @model_validator(mode="after")
    def _bundle_alone(self) -> JobSpec:
        if self.bundle is not None and self.proof.enabled:
            # Records, audits and the referee replay the built-in trainer's steps; a
            # script's steps are its own loop, which no verifier can replay yet.
            raise ValueError("[proof] is not available for a bundled job yet (a verifier "
                             "replays the built-in trainer's steps, not a script's): set "
                             "[proof] enabled = false, or train the built-in model")
        return self

    @model_validator(mode="after")
    def _sync_fits_aggregation(self) -> JobSpec:
        if self.aggregation is not Aggregation.mean and (
                self.sync.mode is not SyncMode.allreduce or self.sync.codec is not Codec.none):
            raise ValueError(f"aggregation = '{self.aggregation.value}' needs every worker's "
                             "full gradient every step: use it with [sync] mode = 'allreduce' "
                             "and codec = 'none', or use aggregation = 'mean'")
        if self.proof.enabled and (self.sync.slt > 0 or self.sync.codec is not Codec.none):
            # A record commits the gradient or pseudo-gradient a worker computed, and every
            # voted step checks that the sum exchanged is the sum of what was committed; a
            # codec's compressed form (with its error feedback) or a late round is neither.
            raise ValueError("[proof] needs [sync] codec = 'none' and slt = 0: an audit "
                             "replays the gradient or pseudo-gradient itself, not a "
                             "compressed or late form of it")
        return self

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir.replace("{name}", self.name)

    @property
    def proof_dir(self) -> str:
        return self.proof.dir.replace("{name}", self.name)

    def hyperparameters(self) -> dict[str, object]:
        """What determines a step's result besides the parameters and samples: every
        work record binds their hash, so nobody can change them after the fact."""
        return self.model_dump(mode="json", exclude={"name", "checkpoint", "proof",
                                                     "eval_interval", "eval_batches"})

    def resume_identity(self) -> dict[str, object]:
        """The parts a checkpoint must agree on to be resumed exactly.

        Steps, intervals and the checkpoint location may change between a
        run and its resume; the model, data, seed and batch may not.
        """
        return {
            "seed": self.seed,
            "global_batch": self.global_batch,
            "model": self.model.model_dump(mode="json"),
            "data": self.data.model_dump(mode="json"),
        }
