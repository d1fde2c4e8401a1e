"""The one place a job's `[sync]` becomes a sync mode: every step (optionally
compressed), DiLoCo, or DiLoCo with bounded staleness."""

from __future__ import annotations

import torch

from shoal.spec.job import SyncSpec
from shoal.spec.plan import SyncMode
from shoal.train.sync.codecs import make_codec
from shoal.train.sync.diloco import DiLoCo
from shoal.train.sync.every_step import EveryStep
from shoal.train.sync.exchange import GradientExchange
from shoal.train.sync.protocol import Sync
from shoal.train.sync.staleness import StaleDiLoCo


def make_sync(spec: SyncSpec | None, exchange: GradientExchange,
              optimizer: torch.optim.Optimizer, exchange_delay_s: float = 0.0) -> Sync:
    """The job's sync: every-step (optionally compressed) or DiLoCo. `exchange_delay_s`:
    an injected fault (`shoal.train.inject`), the least time a DiLoCo outer exchange takes."""
    spec = spec or SyncSpec()
    if spec.mode is SyncMode.diloco and spec.slt > 0:
        return StaleDiLoCo(exchange, optimizer, spec, exchange_delay_s)
    if spec.mode is SyncMode.diloco:
        return DiLoCo(exchange, optimizer, spec, exchange_delay_s)
    float32 = [p.shape for p in exchange.params if p.dtype == torch.float32]
    return EveryStep(exchange, make_codec(spec, float32))
