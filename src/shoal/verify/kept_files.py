"""The bytes of the tensor files a worker keeps for audits: its revealed contributions,
the parameters a step started from, and under DiLoCo its own replica's state.

They are safetensors files: a JSON header and the tensors' bytes, read by a parser
built for files from strangers (no code runs, every offset is checked), in one copy.
A verifier reads a round's worth of them for each DiLoCo audit, and `torch.load`
with `weights_only=True` cost ~1.5 ms a reveal and ~3.5 ms a kept state here, where
this reads them in ~0.3 and ~0.5 ms (most of it the read itself). A torch archive (a
pickle, even under `weights_only`) is not read at all: it is not a tensor file.

Whatever a file holds that is not its kind raises `UnreadableFile`: its writer's
broken commitment, never a verifier's crash.
"""

from __future__ import annotations

import json
import math

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _load_safetensors
from safetensors.torch import save as _save_safetensors

from shoal.train.packing import optimizer_entries

_SCALARS = "scalars"  # a local state's non-tensor optimizer slots, as JSON in the header


class UnreadableFile(Exception):
    """A kept file that exists but is not what its kind holds (its writer's fault: a
    verifier calls the commitment it stands for broken, never crashes on it)."""


# -- writing (workers) --------------------------------------------------------------

def reveal_bytes(tensors: list[torch.Tensor]) -> bytes:
    """A contribution (a list of tensors), in order."""
    return _encode({str(i): t for i, t in enumerate(tensors)})


def reveal_like(original: bytes, tensors: list[torch.Tensor]) -> bytes:
    """`tensors` in `original`'s place: its header byte for byte, each tensor's bytes at
    the offsets it gives the tensor they replace (a forced error's file: how a worker
    laid its file out, a layout the parser takes in many forms, must not tell a plant
    from the worker's own). Each must have its original's dtype and shape."""
    replaced = reveal_from(original)  # checked: the layout below is a valid one
    if len(replaced) != len(tensors) or any(
            a.dtype != b.dtype or a.shape != b.shape for a, b in zip(replaced, tensors)):
        raise ValueError("a file is laid out like a safetensors reveal of the same "
                         "shapes and dtypes only")
    size = int.from_bytes(original[:8], "little")
    header = json.loads(original[8:8 + size])
    out = bytearray(original)
    for i, tensor in enumerate(tensors):
        begin, end = header[str(i)]["data_offsets"]
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[8 + size + begin:8 + size + end] = raw
    return bytes(out)


def params_bytes(state: dict[str, torch.Tensor]) -> bytes:
    """A model's named parameters and buffers."""
    return _encode({f"params/{name}": t for name, t in state.items()})


def local_bytes(params: dict[str, torch.Tensor], optimizer_state: dict) -> bytes:
    """A DiLoCo worker's replica: its parameters and its optimizer's per-parameter state."""
    slots, scalars = optimizer_entries(optimizer_state, prefix="optimizer/")
    tensors = {**{f"params/{name}": t for name, t in params.items()}, **slots}
    return _encode(tensors, {_SCALARS: json.dumps(scalars)} if scalars else None)


def _encode(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    # Each its own copy: safetensors refuses tensors that share storage (tied weights,
    # views of one gradient buffer), and the caller's may move on after this returns.
    owned = {k: t.detach().cpu().contiguous().clone() for k, t in tensors.items()}
    return _save_safetensors(owned, metadata)


# -- reading (verifiers) ------------------------------------------------------------

def kept_file_bound(model: torch.nn.Module) -> int:
    """The most bytes a kept file of this model's job may hold: a verifier reads no more
    of one (a worker could make its file as large as a disk, and each is read whole).
    With room to spare: the model's values six times over at 8 bytes each (a reveal
    holds a gradient and a pseudo-gradient; a kept state the parameters and the
    optimizer's slots, AdamW's two moments, AMSGrad's third), and 16 KiB of header
    for each tensor of four such sets."""
    tensors = list(model.state_dict().values())
    return 6 * 8 * sum(t.numel() for t in tensors) + 16 * 1024 * (4 * len(tensors) + 1)


def reveal_from(data: bytes) -> list[torch.Tensor]:
    """A revealed contribution."""
    tensors, metadata = _decode(data)
    if metadata:
        raise UnreadableFile("a revealed contribution holds no metadata")
    if set(tensors) != {str(i) for i in range(len(tensors))}:
        raise UnreadableFile("the file is not a list of tensors (its names are not 0..n-1)")
    return [tensors[str(i)] for i in range(len(tensors))]


def params_from(data: bytes) -> dict[str, torch.Tensor]:
    """The named tensors a step started from."""
    tensors, metadata = _decode(data)
    if metadata:
        raise UnreadableFile("a parameters file holds no metadata")
    return _under("params/", tensors, "a parameters file")


def local_from(data: bytes) -> tuple[dict[str, torch.Tensor], dict]:
    """(parameters, optimizer state) of a DiLoCo worker's replica."""
    tensors, metadata = _decode(data)
    if set(metadata) - {_SCALARS}:
        raise UnreadableFile("a kept state's metadata holds more than its scalars")
    params = _under("params/", {k: v for k, v in tensors.items() if k.startswith("params/")},
                    "a kept state")
    state: dict[int, dict] = {}
    slots: dict[str, object] = {k: v for k, v in tensors.items() if k.startswith("optimizer/")}
    if len(params) + len(slots) != len(tensors):
        raise UnreadableFile("a kept state holds tensors that are neither parameters nor "
                             "optimizer state")
    try:
        scalars = json.loads(metadata.get(_SCALARS, "{}"))
    except json.JSONDecodeError:
        raise UnreadableFile("a kept state's scalars are not JSON") from None
    if not isinstance(scalars, dict) or not all(
            isinstance(k, str) and k.startswith("optimizer/") and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v) for k, v in scalars.items()):
        raise UnreadableFile("a kept state's scalars are malformed")
    for key, value in [*slots.items(), *scalars.items()]:
        index, _, slot = key.removeprefix("optimizer/").partition("/")
        if not index.isdigit() or not slot or slot in state.get(int(index), {}):
            raise UnreadableFile(f"optimizer state key {key!r} is malformed")
        state.setdefault(int(index), {})[slot] = value
    return params, state


def _decode(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        tensors = _load_safetensors(data)
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
    except (SafetensorError, ValueError, UnicodeDecodeError) as error:
        raise UnreadableFile(f"not a tensor file: {error}"[:300]) from None
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise UnreadableFile("the file's metadata is malformed")
    return tensors, metadata


def _under(prefix: str, tensors: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    if not all(k.startswith(prefix) and len(k) > len(prefix) for k in tensors):
        raise UnreadableFile(f"{kind} names a tensor outside {prefix!r}")
    return {k.removeprefix(prefix): v for k, v in tensors.items()}

