"""Each job's spec, parsed once from the job file its submitter gave (the store keeps
the text; every service that needs a job's steps, proof settings or model reads it
here, so all of them read the same spec)."""

from __future__ import annotations

import threading
import tomllib

from shoal.coordinator.db.schema import JobRow
from shoal.coordinator.db.store import Store
from shoal.coordinator.errors import NotFound
from shoal.spec.job import JobSpec
from shoal.spec.jobfile import parse_job


class JobSpecs:
    """The jobs' specs, parsed from their job files once and kept (a job file never
    changes once submitted)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._specs: dict[str, JobSpec] = {}
        self._lock = threading.Lock()  # API threads, the round loop and the referee read alike

    def job_file(self, job_id: str) -> str:
        """The job file as its submitter gave it (NotFound for no such job)."""
        with self.store.read() as session:
            row = session.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"no job '{job_id}'")
            return row.job_file

    def job_spec(self, job_id: str, job_file: str | None = None) -> JobSpec:
        """The job's spec; `job_file`: its text, when the caller read the row already."""
        with self._lock:
            spec = self._specs.get(job_id)
        if spec is None:
            text = job_file if job_file is not None else self.job_file(job_id)
            spec = parse_job(tomllib.loads(text), source="job_file")
            with self._lock:
                spec = self._specs.setdefault(job_id, spec)
        return spec
