"""Job bundles as the coordinator keeps them (issue 41), a service it holds.

A submitter sends the bundle (`shoal submit SCRIPT`) before the job that names
it; the coordinator keeps the archive under its SHA-256, checked as a provider
would check it (the hash, then the archive against its own manifest), and
remembers who sent it. A job may name only a bundle its own submitter sent: a
bundle's hash is no secret (it is in every lease's job file), and otherwise a
stranger could name someone else's code in a job of its own, lease it to
itself and read it. A bundle is code its submitter may not want public, so it
is read only by a submitter who sent it and by the providers holding a lease
on a job of theirs that names it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shoal.bundle import BundleError, check_bundle
from shoal.coordinator.db.schema import JobRow
from shoal.coordinator.db.store import Store
from shoal.coordinator.errors import Forbidden, NotFound
from shoal.coordinator.settings import CoordinatorSettings
from shoal.spec.bundle import BundleManifest
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec

log = logging.getLogger(__name__)

# How long after its lease ended a provider may still fetch the bundle: its agent may
# have been told of the lease a beat before it ended.
FETCH_GRACE_S = 30.0

# (session, provider, job, lease number or None, grace_s): raises Forbidden unless the
# provider holds such a lease (the checkpoint carry's check).
LeaseCheck = Callable[[Session, str, str, int | None, float], object]


class JobBundles:
    """Bundles kept under `data_dir/bundles`, each with the addresses that sent it."""

    def __init__(self, store: Store, settings: CoordinatorSettings,
                 job_spec: Callable[[str, str | None], JobSpec],
                 active_lease: LeaseCheck) -> None:
        """`job_spec(job_id, job_file)`: the jobs' parsed specs (JobSpecs.job_spec)."""
        self.store, self.settings, self.job_spec, self.active_lease = store, settings, \
            job_spec, active_lease
        self.directory = settings.data_dir / "bundles"
        self._lock = threading.Lock()  # two uploads of one bundle: one owners file

    def archive_path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.tar"

    def put(self, submitter: str, sha256: str, archive: bytes) -> BundleManifest:
        """Keep `archive` as bundle `sha256` sent by `submitter`; its manifest."""
        try:
            manifest = check_bundle(archive, sha256, max_bytes=self.settings.max_file_bytes)
        except BundleError as error:
            raise SpecError(f"bundle {sha256[:16]}…: {error}") from None
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.archive_path(sha256)
            if not path.is_file():
                _write_atomically(path, archive)
            owners = self._owners(sha256)
            if submitter.lower() not in owners:
                _write_atomically(self._owners_path(sha256), json.dumps(
                    sorted(owners | {submitter.lower()})).encode())
        log.info("bundle %s… (%s, %d files, %d bytes) from %s", sha256[:12], manifest.script,
                 len(manifest.files), len(archive), submitter)
        return manifest

    def check_job(self, submitter: str, sha256: str) -> BundleManifest:
        """A job of `submitter`'s may name bundle `sha256`: it is here and was theirs; its
        manifest."""
        if not self.archive_path(sha256).is_file():
            raise SpecError(f"job_file: [bundle] sha256 = {sha256[:16]}… is no bundle this "
                            "coordinator holds: send it first (`shoal submit SCRIPT` does "
                            "both; PUT /v1/bundles/SHA256)")
        if submitter.lower() not in self._owners(sha256):
            raise Forbidden(f"bundle {sha256[:16]}… was not sent by {submitter}: a job names "
                            "only a bundle its own submitter sent (send it yourself)")
        return check_bundle(self.archive_path(sha256).read_bytes(), sha256,
                            max_bytes=self.settings.max_file_bytes)

    def read(self, reader: str, sha256: str) -> Path:
        """The bundle's archive, for a submitter who sent it or a provider holding a lease
        on one of their jobs that names it."""
        path = self.archive_path(sha256)
        owners = self._owners(sha256)
        if not path.is_file() or not owners:
            raise NotFound(f"no bundle {sha256[:16]}…")
        if reader.lower() in owners:
            return path
        with self.store.read() as session:
            for job in session.scalars(select(JobRow).where(func.lower(JobRow.submitter).in_(owners))):
                bundle = self.job_spec(job.job_id, job.job_file).bundle
                if bundle is None or bundle.sha256 != sha256:
                    continue
                try:
                    self.active_lease(session, reader, job.job_id, None, FETCH_GRACE_S)
                    return path
                except Forbidden:
                    continue
        raise Forbidden(f"{reader} holds no lease on a job that runs bundle {sha256[:16]}…: "
                        "a bundle is read by its submitter and the providers of its jobs")

    def _owners_path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.owners.json"

    def _owners(self, sha256: str) -> set[str]:
        try:
            return set(json.loads(self._owners_path(sha256).read_text()))
        except FileNotFoundError:
            return set()


def _write_atomically(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
