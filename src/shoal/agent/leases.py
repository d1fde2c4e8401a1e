"""The workers an agent runs for its leases: one `shoal train --workers 1
--rendezvous ...` launcher per lease, started when the lease is assigned,
told to leave gracefully on a spot notice or when the lease ends, and
watched for its exit.

Each launcher dies with the agent (PDEATHSIG): an agent that is killed
takes its workers with it, the way a lost machine would.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from shoal.agent.bundled import BundledLeases, SandboxedWorker
from shoal import ShoalError
from shoal.agent.checkpoints import checkpoint_dir
from shoal.agent.proofs import proof_dir
from shoal.elastic.gate_keys import PASS_ENV
from shoal.elastic.worker_process import WorkerProcess
from shoal.spec.errors import SpecError
from shoal.spec.job import JobSpec
from shoal.spec.jobfile import parse_job, refuse_for_providers
from shoal.spec.coordinator import Assignment

log = logging.getLogger(__name__)


@dataclass
class LeaseWorker:
    lease: int
    job: str
    process: WorkerProcess | SandboxedWorker
    started_s: float
    leaving: bool = False  # told to leave (notice or lease ended); not restarted
    exit_code: int | None = None
    exited: list[int] = field(default_factory=list)  # exit codes of earlier attempts


class LeaseWorkers:
    def __init__(self, agent_id: str, work_dir: Path, slowdown: float = 1.0,
                 grace_s: float = 20.0, max_restarts: int = 2,
                 adversary: str | None = None, bundled: BundledLeases | None = None) -> None:
        """`bundled`: runs the leases of bundled jobs (None: this agent refuses them)."""
        self.agent_id, self.work_dir, self.adversary = agent_id, work_dir, adversary
        self.bundled = bundled
        self.slowdown, self.grace_s, self.max_restarts = slowdown, grace_s, max_restarts
        self.workers: dict[int, LeaseWorker] = {}
        self.refused: set[int] = set()  # leases whose job file this agent will not run

    def job_file(self, lease: int) -> Path:
        """The job file a lease's worker was started with."""
        return self.work_dir / f"lease-{lease}" / "job.toml"

    def running(self) -> tuple[int, ...]:
        """Leases with a live worker: what the agent reports in its heartbeat."""
        return tuple(sorted(n for n, w in self.workers.items() if w.process.alive()))

    def follow(self, assignments: tuple[Assignment, ...], stop: tuple[int, ...]) -> None:
        """Bring the workers in line with what the coordinator says should run."""
        for number in stop:
            self._leave(number, "its lease ended")
        for assignment in assignments:
            number = assignment.lease.lease
            worker = self.workers.get(number)
            if assignment.ends_at_s is not None:
                self._leave(number, f"spot notice: the lease ends at {assignment.ends_at_s:.0f}")
            elif worker is None:
                self._start(assignment, attempt=0)
            elif not worker.process.alive() and not worker.leaving:
                self._restart(worker, assignment)
        if self.bundled is not None:  # a bundled lease over, its worker gone: its disk goes
            assigned = {a.lease.lease for a in assignments}
            for number in self.bundled.held() - assigned:
                worker = self.workers.get(number)
                if worker is None or not worker.process.alive():
                    self.bundled.release(number)

    def stop_all(self) -> None:
        """Every worker leaves gracefully, then whatever is left after the grace is killed."""
        for number in list(self.workers):
            self._leave(number, "the agent is stopping")
        deadline = time.monotonic() + self.grace_s
        for worker in self.workers.values():
            if not worker.process.wait(deadline - time.monotonic()):
                worker.process.kill()
        if self.bundled is not None:
            self.bundled.release_all()

    def _start(self, assignment: Assignment, attempt: int) -> LeaseWorker | None:
        lease = assignment.lease
        if lease.lease in self.refused:
            return None
        try:  # the agent trusts no one with its disk, not even its coordinator
            spec = parse_job(tomllib.loads(assignment.job_file), "job_file")
            refuse_for_providers(spec)
        except (SpecError, tomllib.TOMLDecodeError) as error:
            self._refuse(lease.lease, lease.job, str(error))
            return None
        lease_dir = self.work_dir / f"lease-{lease.lease}"
        lease_dir.mkdir(parents=True, exist_ok=True)
        job_file = self.job_file(lease.lease)
        job_file.write_text(assignment.job_file)
        node = f"{self.agent_id}-l{lease.lease}-a{attempt}"
        if spec.bundle is not None:
            return self._start_bundled(assignment, spec, node, attempt)
        # The submitter's job file never chooses where on this machine files are written:
        # checkpoints go under the agent's own directory, one per job, kept across leases.
        # Work records and challenge files likewise (the agent uploads and answers from there).
        checkpoints = checkpoint_dir(self.work_dir, lease.job)
        command = [sys.executable, "-m", "shoal.cli.main", "train", str(job_file),
                   "--workers", "1", "--rendezvous", assignment.rendezvous, "--node", node,
                   "--run-dir", str(lease_dir / f"run-{attempt}"), "--grace-s", str(self.grace_s),
                   "--checkpoint-dir", str(checkpoints),
                   "--proof-dir", str(proof_dir(self.work_dir, lease.job)),
                   "--keep-proof-files"]  # the coordinator's window, not the worker's clock
        if self.slowdown > 1.0:
            command += ["--slow", f"0:{self.slowdown}"]
        if self.adversary:
            command += ["--adversary", f"0={self.adversary}"]
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"}
        if assignment.rendezvous_pass is not None:  # the host's gate: the launcher shows it
            env[PASS_ENV] = assignment.rendezvous_pass.model_dump_json()
        process = WorkerProcess(node, command, env, lease_dir / "worker.log",
                                on_exit=lambda _: None)
        log.info("lease %d (job %s): worker %s started, rendezvous %s", lease.lease, lease.job,
                 node, assignment.rendezvous)
        return self._hold(lease.lease, lease.job, process)

    def _start_bundled(self, assignment: Assignment, spec: JobSpec, node: str,
                       attempt: int) -> LeaseWorker | None:
        """A bundled job's worker, once its code and environment are ready (got ready on
        a thread of their own: until then, nothing, and the next beat asks again)."""
        lease = assignment.lease
        if self.bundled is None:
            self._refuse(lease.lease, lease.job, "a bundled job (the submitter's own code), "
                         "and this agent runs none: start it with --bundled-jobs")
            return None
        try:
            code = self.bundled.ready(lease.lease, lease.job, spec)
        except Exception as error:  # a bad bundle, pip failing, no sandbox: said, not run
            self._refuse(lease.lease, lease.job, f"its bundle: {error}")
            return None
        if code is None:
            return None
        try:
            process = self.bundled.start(code, assignment, spec, node, attempt, self.grace_s,
                                         self.work_dir / f"lease-{lease.lease}" / "worker.log")
        except (ShoalError, OSError) as error:  # no cgroup to make: said, and the agent goes on
            self._refuse(lease.lease, lease.job, f"its sandbox: {error}")
            return None
        return self._hold(lease.lease, lease.job, process)

    def _hold(self, number: int, job: str, process: WorkerProcess | SandboxedWorker) -> LeaseWorker:
        worker = LeaseWorker(number, job, process, time.monotonic())
        previous = self.workers.get(number)
        if previous is not None:
            worker.exited = previous.exited + [previous.process.process.returncode]
        self.workers[number] = worker
        return worker

    def _refuse(self, number: int, job: str, why: str) -> None:
        if number not in self.refused:
            log.error("lease %d (job %s): not running it: %s", number, job, why)
            self.refused.add(number)

    def _restart(self, worker: LeaseWorker, assignment: Assignment) -> None:
        code = worker.process.process.returncode
        if code == 0:
            return  # the job is done on this lease; the coordinator will end it
        if len(worker.exited) >= self.max_restarts:
            if not worker.leaving:
                log.error("lease %d: worker exited %d times (last code %s); not restarting",
                          worker.lease, len(worker.exited) + 1, code)
                worker.leaving = True
            return
        log.warning("lease %d: worker exited with code %s; starting it again (it rejoins)",
                    worker.lease, code)
        self._start(assignment, attempt=len(worker.exited) + 1)

    def _leave(self, number: int, why: str) -> None:
        worker = self.workers.get(number)
        if worker is None or worker.leaving:
            return
        worker.leaving = True
        if worker.process.alive():
            log.info("lease %d: worker leaves gracefully (%s)", number, why)
            worker.process.signal(signal.SIGTERM)  # the launcher hands over at a step boundary
