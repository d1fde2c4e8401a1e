"""Reports a run writes for people and benchmarks to read (`--report PATH`)."""

from __future__ import annotations

from pydantic import Field

from shoal.spec.job import Frozen


class TrainReport(Frozen):
    """What one training run did. Losses are mean cross-entropy in nats per byte."""

    job: str
    steps: int = Field(ge=0)  # optimizer steps completed, counting resumed ones
    start_step: int = Field(ge=0)  # 0, or the checkpoint step this run resumed from
    train_loss: float | None  # mean over the last (up to) 20 steps of this run
    val_loss: float | None  # at the final step, on the fixed validation windows
    tokens_per_s: float = Field(ge=0.0)  # training tokens this run processed / wall_s
    wall_s: float = Field(ge=0.0)
    checkpoints: int = Field(ge=0)  # checkpoints written (and verified) by this run
    checkpoint_dir: str
    param_sha256: str  # SHA-256 over parameters in name order; equal runs, equal hash
