"""Compressed exchange with error feedback: int8 quantization, top-k, PowerSGD and
SparseLoCo's one byte per 64 values.

Used for every-step gradients and for DiLoCo's pseudo-gradients alike; the
names are the planner's (`shoal.spec.plan.Codec`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shoal.spec.job import SyncSpec
from shoal.spec.plan import Codec as CodecName
from shoal.train.sync.codecs.base import Codec, Collectives
from shoal.train.sync.codecs.int8 import Int8Codec
from shoal.train.sync.codecs.powersgd import PowerSGDCodec
from shoal.train.sync.codecs.sparseloco import SparseLoCoCodec
from shoal.train.sync.codecs.topk import TopKCodec


def make_codec(spec: SyncSpec, shapes: Sequence[torch.Size]) -> Codec | None:
    """The job's codec over vectors cut into `shapes`; None for `codec = "none"`."""
    if spec.codec is CodecName.int8:
        return Int8Codec(shapes)
    if spec.codec is CodecName.topk:
        return TopKCodec(shapes, spec.topk_fraction)
    if spec.codec is CodecName.powersgd:
        return PowerSGDCodec(shapes, spec.powersgd_rank)
    if spec.codec is CodecName.sparseloco:
        return SparseLoCoCodec(shapes)
    return None


__all__ = ["Codec", "Collectives", "Int8Codec", "PowerSGDCodec", "SparseLoCoCodec", "TopKCodec",
           "make_codec"]
