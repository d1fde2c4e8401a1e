"""Top-k sparsification: the k entries of largest magnitude, as float32 values
and int32 indices (Aji & Heafield 2017; with error feedback, Stich et al.
2018). The rest waits in the residual until it grows large enough to be sent.

Members choose different indices, so messages are all-gathered and scattered
into the sum in rank order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from shoal.train.sync.codecs.base import GatheredCodec


class TopKCodec(GatheredCodec):
    name = "topk"

    def __init__(self, shapes: Sequence[torch.Size], fraction: float) -> None:
        super().__init__(shapes)
        if not 0.0 < fraction < 1.0:
            raise ValueError("topk fraction must be in (0, 1)")
        self.k = max(1, math.ceil(fraction * self.numel))  # the same k on every member

    def _encode(self, corrected: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        indices = torch.topk(corrected.abs(), self.k, sorted=False).indices.to(torch.int32)
        values = corrected[indices.long()]
        mine = torch.zeros_like(corrected)
        mine[indices.long()] = values
        return [values, indices], mine

    def _decode(self, gathered: list[list[torch.Tensor]], numel: int) -> torch.Tensor:
        all_values, all_indices = gathered
        total = torch.zeros(numel)
        for v_r, i_r in zip(all_values, all_indices):  # rank order; a member's indices are unique
            total.index_add_(0, i_r.long(), v_r)
        return total
