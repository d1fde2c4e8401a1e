"""The cost model of one training step, for a batch of layouts at once.

A layout is a grid of device indices, (pp, dp): row j is stage j's group,
column r is replica r's pipeline, so grid[j, r] sends its activations to
grid[j + 1, r]. One vectorized function serves the search, the exhaustive
reference and the comparisons alike, so all are judged by the same rules.

Assumptions: each stage group runs at its slowest device (replicas of a
stage step together), and stages get layers in proportion to that speed
(integer layers, within memory); a stage computes forward and backward of a
micro-batch in layers x FLOPs-per-layer / (slowest peak x efficiency);
the pipeline is GPipe/1F1B-like, (M - 1) micro-batches paced by its slowest
stage or link, plus one pass of fill and drain; each transfer costs the
link's latency plus bytes / bandwidth, activations forward and gradients
back; the data-parallel exchange follows the pipeline (no overlap, but
with bounded staleness DiLoCo's runs beside later rounds: sync.exposed_s),
all stage groups at once; compute and communication do not share links.
A share of each device's memory is kept back for the framework (CostConfig).
Activations are checkpointed at layer boundaries: a stage stores one
boundary per layer for each micro-batch in flight (at most pp). Beside the
model's state, a stage holds what its sync option keeps per parameter
(sync.state_bytes: DiLoCo's outer copy, a codec's residual), so the layers a
stage can take, and whether a layout fits, depend on the option as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shoal.plan.cluster import Topology
from shoal.plan.sync import SyncConfig, choose, ladder, memory_classes
from shoal.spec.plan import ModelProfile


@dataclass(frozen=True)
class CostConfig:
    efficiency: float = 0.4  # achieved share of peak FLOP/s (MFU of large-model training)
    # Share of each device's memory the plan leaves to the framework: the CUDA context and
    # kernels, the allocator's fragmentation, the working set of recomputing one layer
    # (vLLM's default gpu_memory_utilization = 0.9 leaves the same share).
    memory_reserve: float = 0.1
    sync: SyncConfig = field(default_factory=SyncConfig)

    def __post_init__(self) -> None:
        if not 0.0 < self.efficiency <= 1.0:
            raise ValueError("efficiency must be in (0, 1]")
        if not 0.0 <= self.memory_reserve < 1.0:
            raise ValueError("memory_reserve must be in [0, 1)")


@dataclass(frozen=True)
class Costs:
    """Predicted costs of K layouts; inf where a layout does not fit in memory."""

    step_s: np.ndarray  # (K,) per optimizer (inner) step
    compute_s: np.ndarray  # (K,) the slowest stage's compute over all micro-batches
    pipeline_s: np.ndarray  # (K,) compute, transfers and bubble
    exchange_s: np.ndarray  # (K,) data-parallel exchange waited for, amortized over inner steps
    layers: np.ndarray  # (K, pp) layers per stage
    sync: np.ndarray  # (K,) index into sync.ladder


def micro_batches(model: ModelProfile, dp: int) -> int:
    """Micro-batches each pipeline runs per step (the batch split over dp replicas)."""
    return -(-model.batch_samples // (dp * model.micro_batch_samples))


def allocate_layers(speed: np.ndarray, caps: np.ndarray, layers: int) -> np.ndarray:
    """(K, pp) integer layers, each >= 1, summing to `layers`, minimizing the slowest stage.

    Water-filling: one layer at a time to the stage that would finish it
    soonest, never past its memory cap. That greedy is optimal for a
    min-max of l_j / speed_j. Rows that cannot fit get -1 everywhere.
    """
    count = np.ones(speed.shape, dtype=np.int64)
    feasible = (caps >= 1).all(axis=1)
    rows = np.arange(speed.shape[0])
    for _ in range(layers - speed.shape[1]):
        finish = (count + 1) / speed
        finish[count >= caps] = np.inf
        stage = np.argmin(finish, axis=1)
        feasible &= np.isfinite(finish[rows, stage])
        count[rows, stage] += 1
    count[~feasible] = -1
    return count


def evaluate(top: Topology, model: ModelProfile, grids: np.ndarray,
             config: CostConfig = CostConfig(),
             links: tuple[np.ndarray, np.ndarray] | None = None) -> Costs:
    """Costs of layouts `grids`, (K, pp, dp) device indices.

    `links`, if given, are each stage group's slowest bandwidth and largest
    latency, (K, pp) each, already known to the caller (see moves.SwapJudge).
    """
    k, pp, dp = grids.shape
    mb, per_layer_params = model.micro_batch_samples, model.parameters / model.layers
    m = micro_batches(model, dp)
    speed = top.flops[grids].min(axis=2) * config.efficiency  # (K, pp) FLOP/s
    extra, _ = memory_classes(ladder(config.sync))
    memory = top.memory_bytes[grids].min(axis=2) * (1.0 - config.memory_reserve)
    layers = _layers_by_class(speed, memory, model, min(m, pp), extra)  # (C, K, pp)
    fits = layers[:, :, 0] > 0  # (C, K)
    stage_s = layers * (model.flops_per_sample / model.layers * mb) / speed  # (C, K, pp)
    link_s = _transfer_s(top, grids, model.activation_bytes_per_sample * mb)  # (K, pp - 1)
    pace = np.maximum(stage_s.max(axis=2), link_s.max(axis=1, initial=0.0))
    pipeline = (m - 1) * pace + stage_s.sum(axis=2) + 2 * link_s.sum(axis=1)  # (C, K)
    pipeline = np.where(fits, pipeline, np.inf)
    bandwidth, latency = links if links is not None else _group_links(top, grids)
    grad_bytes = layers * per_layer_params * model.gradient_bytes_per_parameter
    sync, exchange = choose(grad_bytes, bandwidth, latency, dp, pipeline, model, config.sync)
    _, class_of = memory_classes(ladder(config.sync))
    c, rows = class_of[sync], np.arange(k)
    compute = m * stage_s.max(axis=2)
    return Costs(step_s=pipeline[c, rows] + exchange, compute_s=compute[c, rows],
                 pipeline_s=pipeline[c, rows], exchange_s=exchange, layers=layers[c, rows],
                 sync=sync)


def _layers_by_class(speed: np.ndarray, memory: np.ndarray, model: ModelProfile, in_flight: int,
                     extra: np.ndarray) -> np.ndarray:
    """(C, K, pp) layers per stage under each memory class (`extra` bytes per parameter
    beside the model's state, ascending); -1 for a row that does not fit.

    The loosest class is allocated in full; a tighter one only where that allocation
    overflows its caps (elsewhere water-filling takes the same steps, as no cap binds).
    """
    k, pp = speed.shape
    per_layer_params = model.parameters / model.layers
    activations = model.activation_bytes_per_sample * model.micro_batch_samples * in_flight
    if pp > model.layers:
        return -np.ones((len(extra), k, pp), dtype=np.int64)
    out = np.empty((len(extra), k, pp), dtype=np.int64)
    for c, bytes_per_parameter in enumerate(extra):
        layer_bytes = per_layer_params * (model.state_bytes_per_parameter + bytes_per_parameter) \
            + activations
        caps = np.floor(memory / layer_bytes)
        if c == 0:
            out[0] = allocate_layers(speed, caps, model.layers)
            continue
        out[c] = out[0]
        redo = (out[0] > caps).any(axis=1) & (out[0, :, 0] > 0)
        if redo.any():
            out[c, redo] = allocate_layers(speed[redo], caps[redo], model.layers)
    return out


def _transfer_s(top: Topology, grids: np.ndarray, message_bytes: float) -> np.ndarray:
    """(K, pp - 1): each stage boundary's time for one micro-batch, its slowest replica's link."""
    src, dst = grids[:, :-1, :], grids[:, 1:, :]
    return (top.latency_s[src, dst] + message_bytes / top.bandwidth[src, dst]).max(axis=2)


def _group_links(top: Topology, grids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, pp) slowest bandwidth and largest latency among the links inside each stage group."""
    if grids.shape[2] == 1:
        shape = grids.shape[:2]
        return np.full(shape, np.inf), np.zeros(shape)
    rows, cols = grids[:, :, :, None], grids[:, :, None, :]
    return top.bandwidth[rows, cols].min(axis=(2, 3)), top.latency_s[rows, cols].max(axis=(2, 3))
