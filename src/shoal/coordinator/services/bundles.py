"""Job bundles as the coordinator keeps them (issue 41), a service it holds.

A submitter sends the bundle (`shoal submit SCRIPT`) before the job that names
it; the coordinator keeps the archive under its SHA-256, checked as a provider
would check it (the hash, then the archive against its own manifest), and
remembers who sent it. A job may name only a bundle its own submitter sent: a
bundle's hash is no secret (it is in every lease's job file), and otherwise a
stranger could name someone else's code in a job of its own, lease it to
itself and read it. A bundle is code its submitter may not want public, so it
is read only by a submitter who sent it and by the providers holding a lease
on a job of theirs that names it. A bundled job's secret variables (its data's
credentials) are kept beside them, for the providers of its running leases.
"""

from __future__ import annotations

import json
import logging
import os
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
from shoal.train.files import write_whole

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
        self._manifests: dict[str, BundleManifest] = {}  # checked once per bundle

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
                write_whole(path, archive)
            self._manifests[sha256] = manifest
            owners = self._owners(sha256)
            if submitter.lower() not in owners:
                write_whole(self._owners_path(sha256), json.dumps(
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
        with self._lock:
            manifest = self._manifests.get(sha256)
        if manifest is None:  # kept by an earlier run of this coordinator: checked again
            manifest = check_bundle(self.archive_path(sha256).read_bytes(), sha256,
                                    max_bytes=self.settings.max_file_bytes)
            with self._lock:
                self._manifests[sha256] = manifest
        return manifest

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


class JobSecrets:
    """Bundled jobs' secret variables (`JobSubmission.secret_env`): kept out of the job
    file (which anyone may read) and out of the store, in one file per job under
    `data_dir/secrets` readable by the coordinator alone; read for each running lease's
    assignment and removed when the job ends."""

    def __init__(self, settings: CoordinatorSettings) -> None:
        self.directory = settings.data_dir / "secrets"
        self._cache: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def keep(self, job_id: str, env: dict[str, str]) -> None:
        if not env:
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.directory / f"{job_id}.json"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(env, out)
        with self._lock:
            self._cache[job_id] = dict(env)

    def of(self, job_id: str) -> dict[str, str]:
        with self._lock:
            cached = self._cache.get(job_id)
        if cached is not None:
            return cached
        try:
            env = json.loads((self.directory / f"{job_id}.json").read_text())
        except FileNotFoundError:
            env = {}
        with self._lock:
            self._cache[job_id] = env
        return env

    def forget(self, job_id: str) -> None:
        (self.directory / f"{job_id}.json").unlink(missing_ok=True)
        with self._lock:
            self._cache[job_id] = {}
