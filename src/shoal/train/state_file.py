"""A training state as the bytes that cross between parties: a safetensors file.

A joiner's live state comes from a peer, a checkpoint on a worker's disk may have
been carried from another provider, and the coordinator takes checkpoints uploaded
by providers (issue 40, point 3). A torch archive, even under
`torch.load(weights_only=True)`, is a zip that torch inflates before anything looks
at it (~1000:1: a 256 MiB upload would take its reader down). A safetensors file
is an 8-byte length, a JSON header and the tensors' raw bytes at offsets the header
gives; its parser (built for files from strangers) checks every offset against the
file, so nothing in it grows when read and no code runs.

A state is more than named tensors: a model's and an optimizer's state dicts
(integer keys, tuples of betas, plain numbers), the RNG's bytes, step, cursor, a
guard's history, a DiLoCo round's outer state. Its shape goes into the header's
metadata as JSON in which every tensor is replaced by its name in the file, and
every container is tagged (a list, a tuple, a dict as key-value pairs), so what
comes back is what went in. Anything else (an object, a set) is refused when
written, with the path to it, rather than silently changed.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _load_safetensors
from safetensors.torch import save as _save_safetensors

from shoal.train.errors import TrainError

FORMAT = "shoal.state/1"  # the metadata key under which a state's shape is kept
SUFFIX = ".safetensors"
MAX_DEPTH = 32  # a state nests a handful of levels; a forged header may nest thousands
_SCALARS = (str, int, float, bool, type(None))
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string: brackets in it do not nest
# Each byte of a JSON text as its change of depth, plus one: opens 2, closes 0, others 1.
_NESTING = bytes(2 if c in b"[{" else 0 if c in b"]}" else 1 for c in range(256))


class StateFileError(TrainError):
    """Bytes that are not a state file, or a state that cannot be written as one."""


def encode(state: Any) -> bytes:
    """`state` (dicts, lists, tuples, tensors and plain scalars) as a safetensors file."""
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()

    def tensor_ref(tensor: torch.Tensor) -> dict[str, str]:
        tensor = tensor.detach().cpu().contiguous()
        # safetensors refuses tensors that share storage (tied weights, views of one
        # buffer): a second view of a storage is written as its own copy.
        if tensor.numel():
            pointer = tensor.untyped_storage().data_ptr()
            if pointer in storages:
                tensor = tensor.clone()
            storages.add(tensor.untyped_storage().data_ptr())
        name = str(len(tensors))
        tensors[name] = tensor
        return {"t": name}

    def shape(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            return tensor_ref(value)
        if isinstance(value, bool | int | float | str) or value is None:
            return value
        if isinstance(value, dict):
            pairs = []
            for key, item in value.items():
                if not isinstance(key, _SCALARS):
                    raise StateFileError(f"{path}: a key of type {type(key).__name__} cannot "
                                         "be written (keys are strings, numbers or None)")
                pairs.append([key, shape(item, f"{path}/{key}")])
            return {"d": pairs}
        if isinstance(value, tuple):
            return {"u": [shape(item, f"{path}/{i}") for i, item in enumerate(value)]}
        if isinstance(value, list):
            return {"l": [shape(item, f"{path}/{i}") for i, item in enumerate(value)]}
        raise StateFileError(f"{path or '/'}: a {type(value).__name__} cannot be written to a "
                             "state file (tensors, numbers, strings, None, and lists, tuples "
                             "and dicts of them can)")

    tree = shape(state, "")
    try:
        return _save_safetensors(tensors, {FORMAT: json.dumps(tree)})
    except (SafetensorError, ValueError, TypeError) as error:
        raise StateFileError(f"the state cannot be written: {error}"[:400]) from None


def _nesting(text: str) -> int:
    """How deep the brackets of the JSON `text` nest, in one pass over it."""
    bare = _STRINGS.sub("", text).encode()
    steps = bare.translate(_NESTING) or b"\x01"
    depth = torch.frombuffer(bytearray(steps), dtype=torch.uint8).to(torch.int64) - 1
    return int(depth.cumsum(0).max())


def decode(data: bytes, limit: int) -> Any:
    """The state in `data`, another party's: at most `limit` bytes, a safetensors file
    (anything else, a torch archive included, is refused unread) whose metadata names
    every tensor it holds exactly once."""
    if len(data) > limit:
        raise StateFileError(f"a state file of {len(data)} bytes (at most {limit})")
    try:
        tensors = _load_safetensors(data)
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
        shape = header["__metadata__"][FORMAT]
        if _nesting(shape) > 3 * (MAX_DEPTH + 1):  # a dict level is three brackets deep
            # Measured before parsing: Python's parser recurses in C, and a thread's stack
            # (a server's handler) gives out before its recursion limit is reached.
            raise StateFileError(f"a state file nested deeper than {MAX_DEPTH}")
        tree = json.loads(shape)
    except (SafetensorError, ValueError, UnicodeDecodeError, KeyError, TypeError,
            RecursionError) as error:
        raise StateFileError(f"not a state file ({type(error).__name__}: {error})"[:400]) from None
    used: set[str] = set()

    def value_of(node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise StateFileError(f"a state file nested deeper than {MAX_DEPTH}")
        if isinstance(node, _SCALARS):
            return node
        if not isinstance(node, dict) or len(node) != 1:
            raise StateFileError("a state file's shape is malformed")
        ((tag, body),) = node.items()
        if tag == "t" and isinstance(body, str) and body in tensors and body not in used:
            used.add(body)
            return tensors[body]
        if tag in ("l", "u") and isinstance(body, list):
            items = [value_of(item, depth + 1) for item in body]
            return items if tag == "l" else tuple(items)
        if tag == "d" and isinstance(body, list):
            out: dict[Any, Any] = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2
                        and isinstance(pair[0], _SCALARS) and pair[0] not in out):
                    raise StateFileError("a state file's dict entry is malformed")
                out[pair[0]] = value_of(pair[1], depth + 1)
            return out
        raise StateFileError(f"a state file's shape has a malformed {tag!r} entry")

    state = value_of(tree, 0)
    if used != set(tensors):
        raise StateFileError(f"a state file holds {len(tensors) - len(used)} tensors its "
                             "shape does not name")
    return state
