"""Check a bundle that came from someone else, then write it out.

A provider (or a verifier, or the referee) holds an archive and the hash the job
names. Nothing of it is trusted before the hash matches; after, the archive must
still be exactly what its manifest says: the manifest first, then each file it
names once, a regular file of the size and hash it lists, and nothing else (no
link, device, directory entry or second copy). The archive is an uncompressed
tar, so no entry is larger than the bytes already held: there is nothing to
inflate. Paths were held to plain relative components when the manifest parsed
(shoal.spec.bundle), so a file is only ever written under `dest`.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from pydantic import ValidationError

from shoal.bundle.pack import FILES, MANIFEST, MAX_BUNDLE_BYTES, BundleError
from shoal.spec.bundle import BundleManifest

MAX_MANIFEST_BYTES = 1 << 20


def check_bundle(archive: bytes, sha256: str, *,
                 max_bytes: int = MAX_BUNDLE_BYTES) -> BundleManifest:
    """`archive`'s manifest, once the archive is checked against `sha256` and against its
    manifest (as `unpack_bundle` checks it), writing nothing."""
    return _verified(archive, sha256, max_bytes)[0]


def unpack_bundle(archive: bytes, sha256: str, dest: Path, *,
                  max_bytes: int = MAX_BUNDLE_BYTES) -> BundleManifest:
    """Check `archive` against `sha256` and its own manifest, write its files under
    `dest` (which must not exist yet, or be empty) and return the manifest."""
    manifest, contents = _verified(archive, sha256, max_bytes)
    if dest.exists() and any(dest.iterdir()):
        raise BundleError(f"{dest} is not empty: a bundle is unpacked into a directory of "
                          "its own")
    for path, data in contents.items():
        target = dest / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except (NotADirectoryError, IsADirectoryError, FileExistsError):
            raise BundleError(f"the bundle's {path!r} is both a file and a directory") from None
    return manifest


def _verified(archive: bytes, sha256: str,
              max_bytes: int) -> tuple[BundleManifest, dict[str, bytes]]:
    if len(archive) > max_bytes:
        raise BundleError(f"a bundle of {len(archive)} bytes (at most {max_bytes})")
    actual = hashlib.sha256(archive).hexdigest()
    if actual != sha256:
        raise BundleError(f"the bundle's SHA-256 is {actual[:16]}…, not the job's "
                          f"{sha256[:16]}…: not the job's code; nothing of it was run")
    return _checked(archive)


def _checked(archive: bytes) -> tuple[BundleManifest, dict[str, bytes]]:
    try:
        tar = tarfile.open(fileobj=io.BytesIO(archive), mode="r:")
    except tarfile.TarError as error:
        raise BundleError(f"the bundle is not an uncompressed tar archive ({error})") from None
    with tar:
        first = tar.next()
        if first is None or first.name != MANIFEST or not first.isreg() \
                or first.size > MAX_MANIFEST_BYTES:
            raise BundleError(f"the bundle does not start with its manifest ({MANIFEST})")
        try:
            manifest = BundleManifest.model_validate_json(_read(tar, first))
        except ValidationError as error:
            raise BundleError(f"the bundle's manifest does not parse: "
                              f"{error.errors()[0]['msg']}") from None
        listed = {f.path: f for f in manifest.files}
        contents: dict[str, bytes] = {}
        while (member := tar.next()) is not None:
            path = member.name.removeprefix(FILES)
            entry = listed.get(path) if member.name.startswith(FILES) else None
            if entry is None or path in contents:
                raise BundleError(f"the bundle holds {member.name!r}, which its manifest does "
                                  "not list (or lists once)")
            if not member.isreg():
                raise BundleError(f"the bundle's {path!r} is not a regular file")
            if member.size != entry.size:
                raise BundleError(f"the bundle's {path!r} is {member.size} bytes, its "
                                  f"manifest says {entry.size}")
            data = _read(tar, member)
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                raise BundleError(f"the bundle's {path!r} is not the file its manifest names")
            contents[path] = data
        missing = sorted(set(listed) - set(contents))
        if missing:
            raise BundleError(f"the bundle lacks {missing[0]!r}, which its manifest lists")
    return manifest, contents


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    if handle is None:
        raise BundleError(f"the bundle's {member.name!r} cannot be read as a file")
    return handle.read()
