"""A tokenized corpus read where it lies, by URL (issue 41): S3, GCS, HTTP(S), a local
path, anything fsspec reads.

The corpus is one or more shards of little-endian token ids (`uint16` or
`uint32`, as nanoGPT's `train.bin` and most tokenizer pipelines write them).
Sample `i` is the `i`-th window of `context + 1` tokens (inputs and next-token
targets), windows never crossing a shard's end. A batch reads exactly its
samples' byte ranges, all of them in one concurrent request to the store
(`cat_ranges`): nothing is downloaded first, and a worker reads only its own
share of each step, in the job's exact data order (`run.batches`).
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import numpy as np
import torch

from shoal.train.errors import TrainError

_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


class TokenShards:
    """Next-token windows of `context` tokens over the token shards at `url` (a file, or
    a glob: `s3://bucket/corpus/train-*.bin`, read in name order). `storage_options`
    go to fsspec (`endpoint_url`, `key`, `secret`, ...); without them, the
    filesystem's own defaults (for S3, the `AWS_*` environment the lease was given)."""

    def __init__(self, url: str, context: int, *, dtype: str = "uint16",
                 storage_options: dict[str, Any] | None = None) -> None:
        if context < 1:
            raise TrainError(f"context must be at least 1 token, not {context}")
        if dtype not in _DTYPES:
            raise TrainError(f"dtype {dtype!r}: token shards are one of {sorted(_DTYPES)}")
        self.url, self.context, self.dtype = url, context, _DTYPES[dtype]
        self._options = dict(storage_options or {})
        self._fs: Any = None
        self._pid = -1
        fs, path = self._filesystem(), fsspec.core.strip_protocol(url)
        paths = sorted(fs.glob(path)) if fsspec.core.has_magic(path) else [path]
        if not paths:
            raise TrainError(f"no token shards match {url}")
        try:
            sizes = [int(fs.size(p)) for p in paths]
        except FileNotFoundError:
            raise TrainError(f"no token shard at {url}") from None
        self.paths = tuple(paths)
        windows = []
        for path, size in zip(paths, sizes):
            if size % self.dtype.itemsize:
                raise TrainError(f"{path} is {size} bytes: not whole {dtype} tokens")
            windows.append(max(0, (size // self.dtype.itemsize - 1) // context))
        self._first = np.concatenate([[0], np.cumsum(windows)]).astype(np.int64)
        if self._first[-1] == 0:
            raise TrainError(f"the shards at {url} hold no window of {context + 1} tokens")

    def _filesystem(self) -> Any:
        """The filesystem, opened again in a process forked after it was (an S3 client's
        connections and event loop do not survive a fork)."""
        if self._fs is None or self._pid != os.getpid():
            protocol = fsspec.core.split_protocol(self.url)[0] or "file"
            self._fs = fsspec.filesystem(protocol, skip_instance_cache=True, **self._options)
            self._pid = os.getpid()
        return self._fs

    def __len__(self) -> int:
        return int(self._first[-1])

    def split(self, held_out: int) -> tuple[Windows, Windows]:
        """The windows to train on and the last `held_out` ones, never trained on."""
        if not 0 < held_out < len(self):
            raise TrainError(f"hold out 1 to {len(self) - 1} of the {len(self)} windows, "
                             f"not {held_out}")
        return Windows(self, 0, len(self) - held_out), Windows(self, len(self) - held_out,
                                                              held_out)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.get_batch(np.array([index]))
        return x[0], y[0]

    def get_batch(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of samples `ids`, each [len(ids), context], as int64."""
        ids = _ids(ids, len(self))
        shard = np.searchsorted(self._first, ids, side="right") - 1
        start = (ids - self._first[shard]) * self.context * self.dtype.itemsize
        size = (self.context + 1) * self.dtype.itemsize
        chunks = self._filesystem().cat_ranges([self.paths[s] for s in shard],
                                               start.tolist(), (start + size).tolist())
        for chunk in chunks:
            if isinstance(chunk, Exception):
                raise chunk
        tokens = np.frombuffer(b"".join(chunks), dtype=self.dtype).reshape(len(ids), -1)
        windows = torch.from_numpy(tokens.astype(np.int64))
        return windows[:, :-1], windows[:, 1:]


class Windows:
    """A contiguous run of a `TokenShards`' windows, read as a batch like the whole."""

    def __init__(self, shards: TokenShards, first: int, count: int) -> None:
        self.shards, self.first, self.count = shards, first, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.get_batch(np.array([index]))
        return x[0], y[0]

    def get_batch(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.shards.get_batch(_ids(ids, self.count) + self.first)


def _ids(ids: np.ndarray, count: int) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= count):
        raise IndexError(f"sample ids {ids.min()}..{ids.max()} outside 0..{count - 1}")
    return ids
