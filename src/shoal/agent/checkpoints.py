"""The agent's side of carried checkpoints (see control.coordinator.checkpoints):
a checkpoint its worker wrote that is newer than the coordinator's goes up;
a newer one at the coordinator comes down into the job's checkpoint folder
here, so a worker of this agent that must restore from disk finds the job's
state even if it never held it.

A download is written as the worker's own store writes (payload, then the
manifest last, each replaced whole), with the identity this agent computes
from the job file it was given, and only after its hash checks out; the
worker's own loader checks both again. Downloads are paced (one per job per
`DOWNLOAD_EVERY_S`, the first at once): only rank 0 writes checkpoints, so
the other agents of a job would otherwise fetch every one of them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from shoal.client.http import CoordinatorClient, CoordinatorRefused
from shoal.errors import ControlError
from shoal.spec.errors import SpecError
from shoal.spec.jobfile import parse_job
from shoal.train.files import (
    checkpoint_manifests,
    manifest_step,
    payload_name,
    prune_checkpoints,
    write_checkpoint,
)

log = logging.getLogger(__name__)
DOWNLOAD_EVERY_S = 30.0
UPLOAD_TRIES = 20  # a refused upload is tried again up to this often (its step's records may lag)
RETRY_MAX_S = 30.0  # ...at the next beat, then after 1 s, 2 s, 4 s... up to this: each try
# re-reads and re-sends the whole file
KEEP_DOWNLOADED = 2


def checkpoint_dir(work_dir: Path, job_id: str) -> Path:
    """Where the agent's workers of `job_id` keep checkpoints (see control.agent.leases)."""
    return work_dir / "jobs" / job_id / "checkpoints"


@dataclass
class _JobCarry:
    downloaded_at: float = float("-inf")
    step: int = -1  # the newest checkpoint here, the one being sent
    tries: int = 0  # its refused uploads
    next_try_at: float = float("-inf")  # refused, it waits longer each time (and is re-read)


class CheckpointRelay:
    def __init__(self, client: CoordinatorClient, work_dir: Path,
                 download_every_s: float = DOWNLOAD_EVERY_S) -> None:
        self.client, self.work_dir, self.download_every_s = client, work_dir, download_every_s
        self._jobs: dict[str, _JobCarry] = {}

    def sync(self, leases: dict[int, tuple[str, Path]], live: set[int] | None = None) -> None:
        """`leases`: lease -> (job, its job file) for this agent's workers, an ended lease's
        too (its worker's last checkpoint is still sent); `live`: those still running, for
        whose jobs newer checkpoints are fetched (None: all). A job none of whose leases
        runs here is not fetched for: the coordinator would refuse it every time."""
        live_jobs = {leases[n][0] for n in (leases if live is None else live) if n in leases}
        by_job: dict[str, tuple[int, Path]] = {}
        for lease, (job_id, job_file) in sorted(leases.items()):
            by_job.setdefault(job_id, (lease, job_file))
        for job_id, (lease, job_file) in by_job.items():
            carry = self._jobs.setdefault(job_id, _JobCarry())
            try:
                self._sync_job(job_id, lease, job_file, carry, job_id in live_jobs)
            except ControlError as error:
                log.warning("job %s: carrying checkpoints failed (%s); trying again", job_id,
                            error)

    def _sync_job(self, job_id: str, lease: int, job_file: Path, carry: _JobCarry,
                  fetch: bool) -> None:
        folder = checkpoint_dir(self.work_dir, job_id)
        manifests = checkpoint_manifests(folder)
        local = (manifest_step(manifests[0]), manifests[0]) if manifests else None
        remote = self.client.carried_checkpoint(job_id)
        remote_step = remote.step if remote is not None else -1
        if local is not None and local[0] > remote_step:
            self._upload(job_id, lease, folder, local, carry)
        elif fetch and remote is not None and remote_step > (local[0] if local else -1):
            now = time.monotonic()
            if now - carry.downloaded_at >= self.download_every_s:
                carry.downloaded_at = now
                self._download(job_id, folder, remote.step, remote.sha256, job_file)

    def _upload(self, job_id: str, lease: int, folder: Path, local: tuple[int, Path],
                carry: _JobCarry) -> None:
        step, manifest_path = local
        if step != carry.step:
            carry.step, carry.tries, carry.next_try_at = step, 0, float("-inf")
        if carry.tries >= UPLOAD_TRIES or time.monotonic() < carry.next_try_at:
            return
        try:
            manifest = json.loads(manifest_path.read_text())
            data = (folder / payload_name(step)).read_bytes()  # not the manifest's word
        except (OSError, ValueError, KeyError) as error:
            log.warning("job %s: checkpoint of step %d unreadable here (%s); not sent",
                        job_id, step, error)
            carry.tries = UPLOAD_TRIES
            return
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            log.warning("job %s: checkpoint of step %d is damaged here; not sent", job_id, step)
            carry.tries = UPLOAD_TRIES
            return
        try:
            view = self.client.upload_checkpoint(job_id, step, lease, data)
        except CoordinatorRefused as refused:
            carry.tries += 1
            wait = 0.0 if carry.tries == 1 else min(2.0 ** (carry.tries - 2), RETRY_MAX_S)
            carry.next_try_at = time.monotonic() + wait
            level = logging.ERROR if carry.tries >= UPLOAD_TRIES else logging.DEBUG
            log.log(level, "job %s: checkpoint of step %d refused (%d): %s", job_id, step,
                    refused.status, refused.detail)
            return
        if view.stored:
            log.info("job %s: checkpoint of step %d carried to the coordinator (%d bytes%s)",
                     job_id, step, view.bytes, ", verified" if view.verified else "")

    def _download(self, job_id: str, folder: Path, step: int, sha256: str,
                  job_file: Path) -> None:
        try:
            identity = parse_job(tomllib.loads(job_file.read_text()), "job_file").resume_identity()
        except (OSError, SpecError, tomllib.TOMLDecodeError) as error:
            log.error("job %s: cannot read its job file %s (%s); no checkpoint fetched",
                      job_id, job_file, error)
            return
        try:
            data = self.client.checkpoint_file(job_id, step)
        except CoordinatorRefused as refused:
            log.warning("job %s: checkpoint of step %d not fetched (%d): %s", job_id, step,
                        refused.status, refused.detail)
            return
        if hashlib.sha256(data).hexdigest() != sha256:
            log.warning("job %s: the fetched checkpoint of step %d does not match its hash "
                        "(replaced meanwhile?); fetching again later", job_id, step)
            return
        write_checkpoint(folder, step, data, identity, time.time(), sha256, carried=True)
        prune_checkpoints(folder, KEEP_DOWNLOADED)
        log.info("job %s: fetched the carried checkpoint of step %d (%d bytes)", job_id, step,
                 len(data))
