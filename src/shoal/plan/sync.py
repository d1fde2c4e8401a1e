"""How stage groups synchronize: every-step all-reduce or DiLoCo, and which codec.

The planner escalates along a ladder from the most faithful option (plain
all-reduce) to the most frugal (DiLoCo with many inner steps and top-k),
and stops at the first whose exchange fits a budget share of the pipeline
time: fidelity is traded for bandwidth only when the network forces it.
Bounded staleness (DiLoCo's `slt = k`) is a rung of its own: a round's
exchange runs beside the next k rounds' compute, so a slow member's exchange
stalls nobody while it takes less than k rounds. It is offered uncompressed
only (the runtime also takes int8 and top-k with it, at a memory cost that
grows with the replicas, as each round in flight gathers every member's message). Each option also has its
price in device memory (DiLoCo's outer copy, a codec's residual, the rounds
in flight), so an option is open only to layouts whose stages hold it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.spec.plan import Codec, ModelProfile, SyncMode

INDEX_BYTES = 4  # top-k sends an int32 index with each kept value
# SparseLoCo (shoal.train.sync.codecs.sparseloco): one byte per block of 64 values and a float32
# scale per 64 blocks.
SPARSELOCO_BYTES_PER_VALUE = 1 / 64 + 4 / 4096
# Codecs whose messages are all-gathered (members keep different entries, or sums would
# overflow) rather than summed along a ring.
GATHERED = frozenset({Codec.topk, Codec.int8, Codec.sparseloco})
# Device memory per parameter beside the model's own state, as the runtime keeps it:
DILOCO_BYTES = 8.0  # theta_outer and the outer momentum, float32 (shoal.train.sync.diloco)
RESIDUAL_BYTES = 4.0  # a codec's error-feedback residual, float32 (shoal.train.sync.codecs.base)
# slt = k (shoal.train.sync.staleness): where the round began, float32, and for each of the k
# rounds in flight this worker's own pseudo-gradient and the sum being reduced, float32.
START_BYTES, IN_FLIGHT_BYTES = 4.0, 8.0
MAX_SLT = 16  # the runtime's bound ([sync] slt)


@dataclass(frozen=True)
class SyncOption:
    mode: SyncMode
    inner_steps: int
    codec: Codec
    slt: int = 0  # DiLoCo rounds applied this many outer steps late (exchange in the background)

    def __post_init__(self) -> None:
        # What the runtime refuses (shoal.spec.job.SyncSpec): staleness delays outer steps,
        # which every-step all-reduce has none of, and PowerSGD's two dependent all-reduces
        # cannot run in the background.
        if self.slt and (self.mode is not SyncMode.diloco or self.codec is Codec.powersgd):
            raise ValueError("slt > 0 needs mode diloco and a codec other than powersgd")


@dataclass(frozen=True)
class SyncConfig:
    # Exchange may take this share of the pipeline time before the planner
    # compresses or goes local (INTELLECT-1 ran at ~83% utilisation; 0.2 keeps us above it).
    exchange_budget: float = 0.2
    inner_steps: tuple[int, ...] = (10, 20, 50, 100, 200, 500)  # DiLoCo ran H = 500
    topk_fraction: float = 0.01
    powersgd_rank: int = 4
    # Staleness bounds the planner may choose, after every H without: on the tiny GPT
    # slt = 1 cost 0.02-0.09 nats of val loss and slt = 2 0.12-0.15 over slt = 0
    # (tests/train/sync/test_slt.py, bench/slt.py: H = 10, 3 workers), int8 0.003 over no
    # codec; but 0.27 nats at H = 20 with 4 workers of 8 samples a step (bench/wan.py).
    staleness: tuple[int, ...] = (1, 2)
    # A SparseLoCo round of H inner steps ranks with uncompressed rounds of this many times
    # H. Measured on the tiny GPT (bench/local_rounds.py: 4 workers of 8 samples, 300
    # steps; every-step 1.992): SparseLoCo at H = 10 ended 2.354 nats, DiLoCo's default
    # outer step at H = 50 with int8 2.338 (bench/wan.py's hosts: 2.354 and 2.338 too);
    # with plain averaging, uncompressed H = 10 2.152, H = 20 2.202, int8 H = 50 2.240.
    sparse_round_cost: int = 5

    def __post_init__(self) -> None:
        if any(not 1 <= k <= MAX_SLT for k in self.staleness):
            raise ValueError(f"staleness must list slt values in 1..{MAX_SLT} (or none)")
        if not 0.0 < self.exchange_budget <= 10.0:
            raise ValueError("exchange_budget must be in (0, 10]")
        if not self.inner_steps or min(self.inner_steps) < 2:
            raise ValueError("inner_steps must list DiLoCo step counts of at least 2")
        if self.sparse_round_cost < 1:
            raise ValueError("sparse_round_cost must be at least 1")
        if not 0.0 < self.topk_fraction < 1.0 or self.powersgd_rank < 1:
            raise ValueError("topk_fraction must be in (0, 1) and powersgd_rank at least 1")


def ladder(config: SyncConfig) -> tuple[SyncOption, ...]:
    """Options from most faithful to most frugal; the planner takes the first that fits."""
    every_step = [SyncOption(SyncMode.allreduce, 1, c) for c in (Codec.none, Codec.int8,
                                                                  Codec.powersgd)]
    # Staleness comes after every H without it: a longer round cost far less than a stale
    # one (bench/wan.py, 4 workers: DiLoCo H = 50 with int8 ended at 2.337, H = 20 at 2.323,
    # H = 20 at slt = 1 at 2.597), so slt is for links no round length hides.
    # Local rounds by how much they cost in quality: uncompressed and int8 (which cost
    # nothing measurable) at each H, and SparseLoCo's byte per 64 values at H where
    # uncompressed rounds of `sparse_round_cost` x H stand (a tie goes to the uncompressed).
    codecs = (Codec.none, Codec.int8, Codec.sparseloco)  # on a tie, in this order
    cost = {Codec.none: 1, Codec.int8: 1, Codec.sparseloco: config.sparse_round_cost}
    local = sorted((SyncOption(SyncMode.diloco, h, c) for h in config.inner_steps for c in codecs),
                   key=lambda o: (o.inner_steps * cost[o.codec], codecs.index(o.codec)))
    stale = [SyncOption(SyncMode.diloco, h, Codec.none, k)
             for h in sorted(config.inner_steps) for k in sorted(config.staleness)]
    most = max(config.inner_steps)
    last = [SyncOption(SyncMode.diloco, most, c) for c in (Codec.powersgd, Codec.topk)]
    return tuple(every_step + local + stale + last)


def state_bytes(option: SyncOption) -> float:
    """Bytes per parameter the option keeps on the device beside the model's own state."""
    extra = DILOCO_BYTES if option.mode is SyncMode.diloco else 0.0
    if option.slt:
        extra += START_BYTES + IN_FLIGHT_BYTES * option.slt
    return extra + (RESIDUAL_BYTES if option.codec is not Codec.none else 0.0)


def memory_classes(options: tuple[SyncOption, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct extra bytes per parameter of `options`, ascending (C,), and each
    option's class (O,): layouts are judged once per class, not once per option."""
    extra, class_of = np.unique([state_bytes(o) for o in options], return_inverse=True)
    return extra, class_of


def wire_ratio(codec: Codec, model: ModelProfile, config: SyncConfig) -> float:
    """Bytes on the wire over uncompressed gradient bytes."""
    grad = model.gradient_bytes_per_parameter
    if codec is Codec.int8:
        return min(1.0, 1.0 / grad)
    if codec is Codec.powersgd:  # a d x d matrix sent as two d x r factors
        return min(1.0, 2.0 * config.powersgd_rank / model.width)
    if codec is Codec.topk:
        return min(1.0, config.topk_fraction * (grad + INDEX_BYTES) / grad)
    if codec is Codec.sparseloco:  # a byte per block, a float32 scale per group of blocks
        return min(1.0, SPARSELOCO_BYTES_PER_VALUE / grad)
    return 1.0


def exchange_s(codec: Codec, grad_bytes: np.ndarray, bandwidth: np.ndarray, latency_s: np.ndarray,
               dp: int, ratio: float) -> np.ndarray:
    """Seconds for one exchange of each stage group (shapes broadcast; 0 when dp == 1)."""
    on_link, waiting = exchange_parts(codec, grad_bytes, bandwidth, latency_s, dp, ratio)
    return on_link + waiting


def exchange_parts(codec: Codec, grad_bytes: np.ndarray, bandwidth: np.ndarray,
                   latency_s: np.ndarray, dp: int, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """One exchange of each stage group: (seconds of bytes on the link, seconds of latency).

    Plain gradients and PowerSGD's factors all-reduce in a ring paced by the
    group's slowest link: 2 (dp-1)/dp of the bytes and 2 (dp-1) latencies
    (PowerSGD does it twice, for both factors, at half the bytes each).
    Top-k and int8 messages cannot be summed in place (int8 would overflow),
    so the runtime all-gathers them and decodes in rank order
    (shoal.train.sync.codecs): (dp-1) times the kept bytes, which past a few
    replicas is more than the plain ring sends.
    """
    if dp == 1:
        zero = np.zeros(np.broadcast(grad_bytes, bandwidth).shape)
        return zero, zero
    sent = grad_bytes * ratio
    if codec in GATHERED:
        on_link, waiting = (dp - 1) * sent / bandwidth, (dp - 1) * latency_s
    else:
        rounds = 2 if codec is Codec.powersgd else 1
        on_link, waiting = 2 * (dp - 1) / dp * sent / bandwidth, rounds * 2 * (dp - 1) * latency_s
    return np.broadcast_arrays(on_link, waiting)


def exposed_s(option: SyncOption, on_link_s: np.ndarray, exchange_s: np.ndarray,
              pipeline_s: np.ndarray) -> np.ndarray:
    """Seconds per step that the exchange adds to the pipeline's.

    Without staleness the exchange is waited for whole, spread over the inner
    steps. With slt = k a round's exchange runs beside the next k rounds of H
    steps (compute and exchange do not share links), so a round lasts the
    longest of: its compute (H x pipeline); the exchange's bytes on the link
    (the rounds in flight share it, so staleness hides no more than one
    round's worth of bandwidth); the whole exchange over k (its latency
    does overlap). Only what outlasts the compute is waited for.
    """
    if option.slt == 0:
        return exchange_s / option.inner_steps
    compute = option.inner_steps * pipeline_s
    round_s = np.maximum(np.maximum(compute, on_link_s), exchange_s / option.slt)
    return (round_s - compute) / option.inner_steps


def choose(grad_bytes: np.ndarray, bandwidth: np.ndarray, latency_s: np.ndarray, dp: int,
           pipeline_s: np.ndarray, model: ModelProfile,
           config: SyncConfig) -> tuple[np.ndarray, np.ndarray]:
    """For each of K layouts: the index into `ladder(config)` and its exchange per step.

    grad_bytes: (C, K, pp), each stage group's gradient under each memory class
    (its layers differ where memory binds); pipeline_s: (C, K), inf where the
    class does not fit; bandwidth, latency_s: (K, pp). Stage groups exchange at
    once, so a layout waits for its slowest group (see exposed_s for how long).
    The first option that fits memory and the budget is taken; where none fits
    the budget, the fastest that fits memory.
    """
    options = ladder(config)
    _, class_of = memory_classes(options)
    pipeline = pipeline_s[class_of].T  # (K, options)
    held = np.isfinite(pipeline)
    columns, exchanges = [], {}  # (class, codec) -> slowest group's (bytes, whole exchange)
    for i, (option, c) in enumerate(zip(options, class_of)):
        if (c, option.codec) not in exchanges:
            on_link, waiting = exchange_parts(option.codec, grad_bytes[c], bandwidth, latency_s,
                                              dp, wire_ratio(option.codec, model, config))
            exchanges[c, option.codec] = on_link.max(axis=1), (on_link + waiting).max(axis=1)
        columns.append(exposed_s(option, *exchanges[c, option.codec],
                                 np.where(held[:, i], pipeline[:, i], 0.0)))
    per_step = np.where(held, np.stack(columns, axis=1), np.inf)  # (K, options)
    fits = held & (per_step <= config.exchange_budget * pipeline)
    first_fit = np.argmax(fits, axis=1)
    fastest = np.argmin(pipeline + per_step, axis=1)
    chosen = np.where(fits.any(axis=1), first_fit, fastest)
    return chosen, per_step[np.arange(len(chosen)), chosen]
