"""Values of the planner: a cluster of devices and links, a model's profile, a plan.

A cluster is what the planner is given (files, the coordinator's view of
its members); a plan is what it answers, in device names so that it can
cross a process. Units are in the names: `_ms`, `_gbps` (Gbit/s), `_gb`, `_s`.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from typing import Annotated

from pydantic import Field, model_validator

from shoal.spec.base import Frozen

Name = Annotated[str, Field(min_length=1, max_length=128)]
Matrix = tuple[tuple[float, ...], ...]


class Device(Frozen):
    """One accelerator as the planner sees it."""

    name: Name
    tflops: float = Field(gt=0.0, le=1e6)  # peak dense TFLOP/s at training precision
    memory_gb: float = Field(gt=0.0, le=1e6)
    region: Name = "default"


class RegionLink(Frozen):
    """Latency and bandwidth between devices of two regions (or within one, if a == b)."""

    a: Name
    b: Name
    latency_ms: float = Field(ge=0.0, le=1e5)
    bandwidth_gbps: float = Field(gt=0.0, le=1e6)


class Cluster(Frozen):
    """Devices and the links between them.

    Links come either as full matrices in device order (`latency_ms`,
    `bandwidth_gbps`, both or neither) or from per-region figures: a
    `RegionLink` for the pair of regions if one is listed, else the
    intra- or inter-region defaults.
    """

    devices: tuple[Device, ...] = Field(min_length=1, max_length=65_536)
    latency_ms: Matrix | None = None
    bandwidth_gbps: Matrix | None = None
    region_links: tuple[RegionLink, ...] = ()
    intra_region_latency_ms: float = Field(0.5, ge=0.0, le=1e5)
    intra_region_bandwidth_gbps: float = Field(100.0, gt=0.0, le=1e6)
    inter_region_latency_ms: float = Field(80.0, ge=0.0, le=1e5)
    inter_region_bandwidth_gbps: float = Field(1.0, gt=0.0, le=1e6)

    @model_validator(mode="after")
    def _consistent(self) -> Cluster:
        names = [d.name for d in self.devices]
        twice = sorted(n for n, count in Counter(names).items() if count > 1)
        if twice:
            raise ValueError(f"device names listed twice: {twice[:5]}; give each device its own name")
        if (self.latency_ms is None) != (self.bandwidth_gbps is None):
            raise ValueError("give both latency_ms and bandwidth_gbps matrices, or neither "
                             "(then the region defaults apply)")
        n = len(self.devices)
        for label, matrix, low in (("latency_ms", self.latency_ms, 0.0),
                                   ("bandwidth_gbps", self.bandwidth_gbps, None)):
            if matrix is not None:
                _check_matrix(label, matrix, n, low)
        return self


def _check_matrix(label: str, matrix: Matrix, n: int, low: float | None) -> None:
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise ValueError(f"{label} must be {n}x{n} (one row and column per device, in order)")
    for i, row in enumerate(matrix):
        # A device's link to itself is never used, so the diagonal may hold anything.
        bad = [j for j, v in enumerate(row) if j != i and not (
            math.isfinite(v) and (v >= low if low is not None else v > 0.0))]
        if bad:
            need = "a finite value >= 0" if low is not None else "a finite value > 0"
            raise ValueError(f"{label}[{i}][{bad[0]}] = {row[bad[0]]}: needs {need}")


class ModelProfile(Frozen):
    """What the planner needs to know of a model and its batch.

    Parameters, activations and FLOPs are taken as spread evenly over the
    layers (embeddings included): a stage's share is proportional to its layers.
    """

    name: Name = "model"
    layers: int = Field(ge=1, le=10_000)
    width: int = Field(ge=1, le=1_000_000)  # hidden size; sets PowerSGD's compression
    parameters: int = Field(ge=1)
    activation_bytes_per_sample: float = Field(gt=0.0)  # one layer boundary, one sample
    flops_per_sample: float = Field(gt=0.0)  # forward and backward, whole model
    batch_samples: int = Field(512, ge=1)  # global batch of one optimizer step
    micro_batch_samples: int = Field(1, ge=1)
    gradient_bytes_per_parameter: float = Field(2.0, gt=0.0)  # bf16 gradients on the wire
    state_bytes_per_parameter: float = Field(16.0, gt=0.0)  # weights, grads, Adam moments


def gpt_profile(name: str, layers: int, width: int, context: int, vocab: int,
                batch_samples: int, micro_batch_samples: int = 1) -> ModelProfile:
    """A decoder-only transformer: 12 L d^2 + embeddings parameters, 6 N + 6 L T d FLOPs a token."""
    parameters = 12 * layers * width * width + vocab * width + context * width
    flops_per_token = 6 * parameters + 6 * layers * context * width  # Kaplan et al. 2020
    return ModelProfile(
        name=name, layers=layers, width=width, parameters=parameters,
        activation_bytes_per_sample=2.0 * context * width,  # bf16 hidden states
        flops_per_sample=float(flops_per_token * context),
        batch_samples=batch_samples, micro_batch_samples=micro_batch_samples,
    )


def gpt3_xl() -> ModelProfile:
    """GPT-3 XL (1.3B), as in DT-FM's experiments: 24 layers, width 2048, sequence 2048."""
    return gpt_profile("gpt3-xl", layers=24, width=2048, context=2048, vocab=50_257,
                       batch_samples=512)


def tiny_gpt() -> ModelProfile:
    """The byte-level GPT of examples/tiny-gpt.toml (4 layers, width 128, context 128)."""
    return gpt_profile("tiny-gpt", layers=4, width=128, context=128, vocab=256, batch_samples=32)


MODEL_PRESETS = {"gpt3-xl": gpt3_xl, "tiny-gpt": tiny_gpt}


class SyncMode(str, enum.Enum):
    """How data-parallel replicas agree on weights."""

    allreduce = "allreduce"  # gradients averaged every step
    diloco = "diloco"  # inner steps alone, then an outer step over averaged pseudo-gradients


class Codec(str, enum.Enum):
    """How exchanged tensors are compressed (all with error feedback)."""

    none = "none"
    int8 = "int8"
    topk = "topk"
    powersgd = "powersgd"
    sparseloco = "sparseloco"  # the largest of each 64 values, in one byte


class StepBreakdown(Frozen):
    """Where the predicted step time goes, in seconds."""

    compute_s: float  # the slowest stage's compute for all of its micro-batches
    pipeline_s: float  # the whole pipeline: compute, transfers and the bubble
    # data-parallel exchange per optimizer step (amortized over inner steps), the part
    # that waits: with slt, what a round's exchange takes beyond the compute it runs beside
    exchange_s: float


class Plan(Frozen):
    """A layout of the cluster for one model and how replicas synchronize."""

    dp: int = Field(ge=1)  # replicas of each stage
    pp: int = Field(ge=1)  # pipeline stages
    stages: tuple[tuple[Name, ...], ...]  # in pipeline order; position r of each is replica r
    layers: tuple[int, ...]  # layers held by each stage
    unused: tuple[Name, ...] = ()  # devices left out (dp * pp must fit the cluster)
    mode: SyncMode = SyncMode.allreduce
    inner_steps: int = Field(1, ge=1)  # DiLoCo: local steps between outer steps
    codec: Codec = Codec.none
    # DiLoCo: rounds applied this many outer steps late, their exchange in the background
    # (the job file's [sync] slt; the runtime bounds it at 16)
    slt: int = Field(0, ge=0, le=16)
    step_time_s: float = Field(ge=0.0)
    breakdown: StepBreakdown

    @model_validator(mode="after")
    def _shape(self) -> Plan:
        if len(self.stages) != self.pp or any(len(s) != self.dp for s in self.stages):
            raise ValueError(f"stages must be {self.pp} lists of {self.dp} devices")
        if len(self.layers) != self.pp or min(self.layers) < 1:
            raise ValueError("layers must give each stage at least one layer")
        names = [n for s in self.stages for n in s] + list(self.unused)
        if len(set(names)) != len(names):
            raise ValueError("a device appears twice in the plan")
        if self.mode is SyncMode.allreduce and self.inner_steps != 1:
            raise ValueError("inner_steps applies to the diloco mode only; use 1")
        if self.slt and (self.mode is not SyncMode.diloco or self.codec is Codec.powersgd):
            # As the runtime's [sync] refuses it: see shoal.spec.job.SyncSpec.
            raise ValueError("slt > 0 applies to the diloco mode only, and not with powersgd")
        return self

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(n for s in self.stages for n in s)
