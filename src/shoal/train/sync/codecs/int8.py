"""int8 quantization: each chunk of the vector as 8-bit integers and one float32
scale (its largest magnitude over 127). About a quarter of float32's bytes.

Messages are all-gathered and decoded in rank order: int8 values cannot be
summed in place without overflow, and the order fixes the bits of the sum.
"""

from __future__ import annotations

import torch

from shoal.train.sync.codecs.base import GatheredCodec

CHUNK = 1024  # values per scale: 4 bytes of scale per 1024 of int8 (0.4% overhead)


def quantize(x: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale per chunk); round to nearest."""
    padded = torch.nn.functional.pad(x, (0, -x.numel() % chunk)).view(-1, chunk)  # (C, chunk)
    scales = padded.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(padded / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.view(-1)[: x.numel()], scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    padded = torch.nn.functional.pad(q.float(), (0, -q.numel() % chunk)).view(-1, chunk)
    return (padded * scales[:, None]).view(-1)[: q.numel()]


class Int8Codec(GatheredCodec):
    name = "int8"

    def _encode(self, corrected: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        q, scales = quantize(corrected)
        return [q, scales], dequantize(q, scales)

    def _decode(self, gathered: list[list[torch.Tensor]], numel: int) -> torch.Tensor:
        values, all_scales = gathered
        total = torch.zeros(numel)
        for q_r, s_r in zip(values, all_scales):  # rank order: the same bits everywhere
            total += dequantize(q_r, s_r)
        return total
