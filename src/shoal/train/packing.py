"""A model's or optimizer's state as a few flat tensors and a small index.

Under DiLoCo every worker keeps its own state for every step, and an audit of
a round's end reads the round's. `torch.load` with `weights_only=True` (the
only safe way to read a stranger's file) costs about 70 µs a tensor here, and
an AdamW state is three tensors per parameter: one flat tensor per dtype is
read in a fraction of that. The files are written by the worker under audit,
so unpacking checks every offset and shape and refuses what does not fit.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}


class PackError(ValueError):
    """A packed state that does not unpack (a malformed or forged file)."""


def pack(tensors: dict[str, torch.Tensor], scalars: dict[str, float | int] | None = None) -> dict:
    keys, shapes, dtypes = [], [], []
    parts: dict[str, list[torch.Tensor]] = defaultdict(list)
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise PackError(f"{key}: dtype {dtype} is not packed")
        keys.append(key)
        shapes.append(list(tensor.shape))
        dtypes.append(dtype)
        parts[dtype].append(tensor.reshape(-1))
    return {"keys": keys, "shapes": shapes, "dtypes": dtypes, "scalars": dict(scalars or {}),
            "flat": {dtype: torch.cat(p) for dtype, p in parts.items()}}


def unpack(packed: object) -> tuple[dict[str, torch.Tensor], dict[str, float | int]]:
    """(tensors, scalars) of `pack`'s output; PackError if anything does not fit."""
    if not isinstance(packed, dict):
        raise PackError("not a packed state")
    keys, shapes, dtypes = packed.get("keys"), packed.get("shapes"), packed.get("dtypes")
    flat, scalars = packed.get("flat"), packed.get("scalars")
    if not (isinstance(keys, list) and isinstance(shapes, list) and isinstance(dtypes, list)
            and isinstance(flat, dict) and isinstance(scalars, dict)
            and len(keys) == len(shapes) == len(dtypes)):
        raise PackError("a packed state's index is malformed")
    offsets: dict[str, int] = defaultdict(int)
    out: dict[str, torch.Tensor] = {}
    for key, shape, dtype in zip(keys, shapes, dtypes):
        buffer = flat.get(dtype)
        if not isinstance(key, str) or key in out or not isinstance(buffer, torch.Tensor) \
                or dtype not in _DTYPES or buffer.dtype != _DTYPES[dtype] or buffer.dim() != 1 \
                or not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise PackError(f"entry {key!r} of a packed state is malformed")
        size = math.prod(shape)
        start = offsets[dtype]
        if start + size > buffer.numel():
            raise PackError(f"entry {key!r} runs past its buffer")
        out[key] = buffer[start:start + size].view(shape)
        offsets[dtype] = start + size
    if any(offsets[d] != b.numel() for d, b in flat.items() if isinstance(b, torch.Tensor)):
        raise PackError("a packed state's buffers hold more than its index names")
    if not all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in scalars.items()):
        raise PackError("a packed state's scalars are malformed")
    return out, scalars


def optimizer_entries(state: dict, prefix: str = "") -> tuple[dict[str, torch.Tensor],
                                                             dict[str, float | int]]:
    """An optimizer's per-parameter state ({index: {name: value}}) as flat entries named
    `{prefix}{index}/{name}`: (its tensors, its other values)."""
    tensors, scalars = {}, {}
    for index, slots in state.items():
        for name, value in slots.items():
            key = f"{prefix}{index}/{name}"
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            else:
                scalars[key] = value
    return tensors, scalars


def pack_optimizer_state(state: dict) -> dict:
    """An optimizer's per-parameter state ({index: {name: value}}), packed."""
    return pack(*optimizer_entries(state))


def unpack_optimizer_state(packed: object) -> dict:
    tensors, scalars = unpack(packed)
    state: dict[int, dict] = defaultdict(dict)
    for key, value in [*tensors.items(), *scalars.items()]:
        index, _, name = key.partition("/")
        if not index.isdigit() or not name:
            raise PackError(f"optimizer state key {key!r} is malformed")
        state[int(index)][name] = value
    return dict(state)
