"""Leases of bundled jobs (issue 41): the submitter's own script, fetched from the
coordinator, checked against the hash its job names, run in its own environment
and inside the provider's sandbox.

Getting a lease's code ready may take minutes (pip building an environment), so
it runs on a thread of its own while the agent goes on beating; the worker starts
at the first beat after it is ready, from the beat's thread (a worker dies with
the thread that started it). A bundle that fails its check, or an environment
that cannot be built, is said once and the lease is not run: the coordinator ends
it when its worker never joins.

The worker is `shoal run SCRIPT --workers 1 --rendezvous ...` on the environment's
interpreter, in a sandbox whose read-write directory is the lease's `job/`: the
unpacked code, the launcher's run directory, the job's checkpoints and its home.
It is given exactly its environment (nothing of the agent's own): the rendezvous
pass, the job's steps and global batch (`run.batches` holds the script's loop to
them), the variables the job file's `[bundle] env` names and the lease's secret
ones (the data's credentials, from its assignment: never written to disk here).
"""

from __future__ import annotations

import hashlib
import logging
import signal
import site
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import shoal
from shoal.agent.environments import Environments, provider_torch
from shoal.agent.sandbox import Disk, Limits, Sandbox
from shoal.bundle import check_bundle, unpack_bundle
from shoal.client.http import CoordinatorClient
from shoal.elastic.gate_keys import PASS_ENV
from shoal.elastic.worker_process import exited_within
from shoal.errors import ControlError
from shoal.spec.bundle import JOB_GLOBAL_BATCH_ENV, JOB_STEPS_ENV
from shoal.spec.coordinator import Assignment
from shoal.spec.job import JobSpec
from shoal.train.files import write_whole

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadyCode:
    """A lease's bundle, unpacked and checked, and the interpreter of its environment."""

    directory: Path  # the sandbox's read-write directory; the code is under code/
    script: Path
    python: Path
    environment: Path


class BundledLeases:
    """Gets bundled leases' code ready off the beat's thread and starts their workers in
    sandboxes."""

    def __init__(self, client: CoordinatorClient, work_dir: Path, environments: Environments,
                 limits: Limits = Limits()) -> None:
        self.client, self.work_dir = client, work_dir
        self.environments, self.limits = environments, limits
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bundle")
        self._ready: dict[int, Future[ReadyCode]] = {}
        self._disks: dict[int, Disk] = {}
        self._lock = threading.Lock()  # the disks, from the preparing threads and the beat's
        self._fetch_lock = threading.Lock()
        for image in work_dir.glob("lease-*/.job.disk"):  # an earlier run's, killed: not ours
            Disk.release_image(image)

    def ready(self, lease: int, job: str, spec: JobSpec) -> ReadyCode | None:
        """The lease's code once ready; None while it is being got ready. Raises what
        stopped it (the caller says it once and does not run the lease)."""
        with self._lock:
            future = self._ready.get(lease)
            if future is None:
                future = self._pool.submit(self._prepare, lease, job, spec)
                self._ready[lease] = future
        if not future.done():
            return None
        return future.result()

    def start(self, code: ReadyCode, assignment: Assignment, spec: JobSpec, node: str,
              attempt: int, grace_s: float, log_path: Path) -> SandboxedWorker:
        """Start the lease's worker in a sandbox of its own (from the beat's thread)."""
        assert spec.bundle is not None
        lease = assignment.lease.lease
        sandbox = Sandbox(f"{node}", code.directory, limits=self.limits,
                          read_only=(code.environment, *_provider_paths()))
        argv = [str(code.python), "-m", "shoal.cli.main", "run", str(code.script),
                "--workers", "1", "--rendezvous", assignment.rendezvous, "--node", node,
                "--run-dir", str(code.directory / f"run-{attempt}"),
                "--grace-s", str(grace_s),
                "--checkpoint-dir", str(code.directory / "checkpoints"),
                "--", *spec.bundle.args]
        # The lease's secret variables (the data's credentials) go into the worker's
        # environment and nowhere on this machine's disk.
        env = {**spec.bundle.env, **assignment.secret_env,
               "PATH": "/usr/bin:/bin", "HOME": str(code.directory),
               "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1",
               JOB_STEPS_ENV: str(spec.steps), JOB_GLOBAL_BATCH_ENV: str(spec.global_batch)}
        if assignment.rendezvous_pass is not None:
            env[PASS_ENV] = assignment.rendezvous_pass.model_dump_json()
        log.info("lease %d (job %s): bundled worker %s starts in its sandbox", lease,
                 assignment.lease.job, node)
        return SandboxedWorker(sandbox, argv, env, log_path)

    def release(self, lease: int) -> None:
        """The lease is over and its worker gone: its disk (and all on it) goes."""
        with self._lock:
            future = self._ready.pop(lease, None)
        if future is not None and not future.done():
            future.add_done_callback(lambda _: self.release(lease))  # once it is made
            return
        with self._lock:
            disk = self._disks.pop(lease, None)
        if disk is not None:
            disk.release()
            log.info("lease %d: its disk released", lease)

    def held(self) -> set[int]:
        """The leases whose code is got ready or held here."""
        with self._lock:
            return set(self._ready) | set(self._disks)

    def release_all(self) -> None:
        for lease in self.held():
            self.release(lease)

    def _prepare(self, lease: int, job: str, spec: JobSpec) -> ReadyCode:
        assert spec.bundle is not None
        sha256 = spec.bundle.sha256
        archive = self._archive(sha256)
        manifest = check_bundle(archive, sha256)  # nothing of it written before this
        here = provider_torch()
        if manifest.torch is not None and manifest.torch != here:
            # The auction leases a bundle's job only to offers of its release; a lease that
            # gets here anyway is refused now, not found out at an audit.
            raise ControlError(f"the bundle was written against torch {manifest.torch}; "
                               f"this agent's workers run {here}")
        directory = self.work_dir / f"lease-{lease}" / "job"
        # The job's directory is a disk of its own: filling it fills only that. (Made
        # afresh: what an earlier agent left there is not this lease's.)
        disk = Disk(directory, self.limits.disk_bytes)
        with self._lock:
            self._disks[lease] = disk
        code_dir = directory / "code"
        unpack_bundle(archive, sha256, code_dir)
        python = self.environments.python(manifest)
        log.info("lease %d (job %s): bundle %s… ready (%s, %d requirements)", lease, job,
                 sha256[:12], manifest.script, len(manifest.requirements))
        return ReadyCode(directory, code_dir / manifest.script, python,
                         self.environments.root / manifest.requirements_sha256)

    def _archive(self, sha256: str) -> bytes:
        """The bundle, from this agent's cache or the coordinator (checked either way by
        unpacking against the job's hash)."""
        cached = self.work_dir / "bundles" / f"{sha256}.tar"
        with self._fetch_lock:
            if cached.is_file():
                archive = cached.read_bytes()
                if hashlib.sha256(archive).hexdigest() == sha256:
                    return archive
                log.warning("the cached bundle %s… is not what its name says; fetching it "
                            "again", sha256[:12])
                cached.unlink()
            try:
                archive = self.client.bundle(sha256)
            except ControlError as error:
                raise ControlError(f"fetching bundle {sha256[:12]}…: {error}") from None
            if hashlib.sha256(archive).hexdigest() == sha256:  # only what it claims is kept
                write_whole(cached, archive)
            return archive


class SandboxedWorker:
    """A lease's worker in its sandbox, as `LeaseWorkers` holds a worker process: alive,
    signalled (the signal reaches the job's launcher), waited for, killed whole."""

    def __init__(self, sandbox: Sandbox, argv: list[str], env: dict[str, str],
                 log_path: Path) -> None:
        self.sandbox = sandbox
        with open(log_path, "ab") as output:
            self.process = sandbox.start(argv, env, stdout=output, stderr=subprocess.STDOUT)
        self._closed = threading.Event()
        threading.Thread(target=self._reap, name=f"sandbox-{sandbox.name}", daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            self.sandbox.signal(self.process, signum)

    def wait(self, timeout_s: float) -> bool:
        return exited_within(self.process, timeout_s)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)  # bubblewrap: the job dies with it
        self.process.wait()
        self.sandbox.close()

    def _reap(self) -> None:
        """Once the job's first process exits, whatever it left running is ended too."""
        self.process.wait()
        self.sandbox.close()


def _provider_paths() -> tuple[Path, ...]:
    """What the job's environment reaches through to (read-only): the agent's own
    packages (torch, shoal and theirs) and, for a shoal installed from a checkout, its
    source."""
    paths = [Path(p) for p in site.getsitepackages()]
    paths.append(Path(sys.prefix))
    paths.append(Path(shoal.__file__).resolve().parent.parent)
    return tuple(p for p in dict.fromkeys(paths) if p.exists())


