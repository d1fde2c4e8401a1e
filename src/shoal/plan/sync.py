"""How stage groups synchronize: every-step all-reduce or DiLoCo, and which codec.

The planner escalates along a ladder from the most faithful option (plain
all-reduce) to the most frugal (DiLoCo with many inner steps and top-k),
and stops at the first whose exchange fits a budget share of the pipeline
time: fidelity is traded for bandwidth only when the network forces it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.spec.plan import Codec, ModelProfile, SyncMode

INDEX_BYTES = 4  # top-k sends an int32 index with each kept value


@dataclass(frozen=True)
class SyncOption:
    mode: SyncMode
    inner_steps: int
    codec: Codec


@dataclass(frozen=True)
class SyncConfig:
    # Exchange may take this share of the pipeline time before the planner
    # compresses or goes local (INTELLECT-1 ran at ~83% utilisation; 0.2 keeps us above it).
    exchange_budget: float = 0.2
    inner_steps: tuple[int, ...] = (10, 20, 50, 100, 200, 500)  # DiLoCo ran H = 500
    topk_fraction: float = 0.01
    powersgd_rank: int = 4

    def __post_init__(self) -> None:
        if not 0.0 < self.exchange_budget <= 10.0:
            raise ValueError("exchange_budget must be in (0, 10]")
        if not self.inner_steps or min(self.inner_steps) < 2:
            raise ValueError("inner_steps must list DiLoCo step counts of at least 2")
        if not 0.0 < self.topk_fraction < 1.0 or self.powersgd_rank < 1:
            raise ValueError("topk_fraction must be in (0, 1) and powersgd_rank at least 1")


def ladder(config: SyncConfig) -> tuple[SyncOption, ...]:
    """Options from most faithful to most frugal; the planner takes the first that fits."""
    every_step = [SyncOption(SyncMode.allreduce, 1, c) for c in (Codec.none, Codec.int8,
                                                                  Codec.powersgd)]
    local = [SyncOption(SyncMode.diloco, h, c)
             for h in sorted(config.inner_steps) for c in (Codec.none, Codec.int8)]
    most = max(config.inner_steps)
    last = [SyncOption(SyncMode.diloco, most, c) for c in (Codec.powersgd, Codec.topk)]
    return tuple(every_step + local + last)


def wire_ratio(codec: Codec, model: ModelProfile, config: SyncConfig) -> float:
    """Bytes on the wire over uncompressed gradient bytes."""
    grad = model.gradient_bytes_per_parameter
    if codec is Codec.int8:
        return min(1.0, 1.0 / grad)
    if codec is Codec.powersgd:  # a d x d matrix sent as two d x r factors
        return min(1.0, 2.0 * config.powersgd_rank / model.width)
    if codec is Codec.topk:
        return min(1.0, config.topk_fraction * (grad + INDEX_BYTES) / grad)
    return 1.0


def exchange_s(codec: Codec, grad_bytes: np.ndarray, bandwidth: np.ndarray, latency_s: np.ndarray,
               dp: int, ratio: float) -> np.ndarray:
    """Seconds for one exchange of each stage group (shapes broadcast; 0 when dp == 1).

    Dense codecs all-reduce in a ring paced by the group's slowest link:
    2 (dp-1)/dp of the bytes and 2 (dp-1) latencies (PowerSGD does it twice,
    for both factors, at half the bytes each). Top-k cannot be summed in
    place, so it all-gathers: (dp-1) times the kept bytes.
    """
    if dp == 1:
        return np.zeros(np.broadcast(grad_bytes, bandwidth).shape)
    sent = grad_bytes * ratio
    if codec is Codec.topk:
        return (dp - 1) * sent / bandwidth + (dp - 1) * latency_s
    rounds = 2 if codec is Codec.powersgd else 1
    return 2 * (dp - 1) / dp * sent / bandwidth + rounds * 2 * (dp - 1) * latency_s


def choose(grad_bytes: np.ndarray, bandwidth: np.ndarray, latency_s: np.ndarray, dp: int,
           pipeline_s: np.ndarray, model: ModelProfile,
           config: SyncConfig) -> tuple[np.ndarray, np.ndarray]:
    """For each of K layouts: the index into `ladder(config)` and its exchange per step.

    grad_bytes, bandwidth, latency_s: (K, pp), per stage group; pipeline_s: (K,).
    Stage groups exchange at once, so a layout waits for its slowest group;
    DiLoCo's exchange is spread over its inner steps.
    """
    options = ladder(config)
    per_step = np.stack([
        exchange_s(o.codec, grad_bytes, bandwidth, latency_s, dp,
                   wire_ratio(o.codec, model, config)).max(axis=1) / o.inner_steps
        for o in options
    ], axis=1)  # (K, options)
    fits = per_step <= config.exchange_budget * pipeline_s[:, None]
    first_fit = np.argmax(fits, axis=1)
    best = np.argmin(per_step, axis=1)
    chosen = np.where(fits.any(axis=1), first_fit, best)
    return chosen, per_step[np.arange(len(chosen)), chosen]
