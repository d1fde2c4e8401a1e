"""Torch archives that came from another party, checked before torch reads them.

`torch.load(weights_only=True)` runs no code, but it inflates what an archive
holds before anything else looks at it: a zip entry stored deflated grows ~1000:1,
so a 256 MiB upload would take its reader down (issue 40, point 3). `torch.save`
never compresses (every entry is stored), so an archive from an honest worker has
entries whose sizes add up to less than its own length. Here the zip's central
directory is read (a few bytes per entry, nothing inflated) and an archive is
refused unless every entry is stored and all of them fit in `limit`; what torch
then allocates is bounded by the bytes actually received.
"""

from __future__ import annotations

import io
import zipfile

from shoal.train.errors import TrainError

MAX_ENTRIES = 1 << 16  # a model's tensors and the pickle: thousands at most


class ArchiveError(TrainError):
    """A torch archive refused before loading (compressed, too large, or not one)."""


def check_archive(data: bytes, limit: int) -> None:
    """Refuse `data` unless it is a zip whose entries are all stored, uncompressed, and
    add up to at most `limit` bytes."""
    if len(data) > limit:
        raise ArchiveError(f"an archive of {len(data)} bytes (at most {limit})")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise ArchiveError(f"not a torch archive ({error})") from None
    if len(entries) > MAX_ENTRIES:
        raise ArchiveError(f"an archive of {len(entries)} entries (at most {MAX_ENTRIES})")
    total = 0
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED or entry.compress_size != entry.file_size:
            raise ArchiveError(f"entry {entry.filename[:80]!r} is compressed: torch.save never "
                               "compresses, so this archive was not written by a worker")
        total += entry.file_size
    if total > limit:
        raise ArchiveError(f"an archive whose entries hold {total} bytes (at most {limit})")
