"""`shoal demo`: the whole network on one machine.

An embedded chain with the market contract; the coordinator (SQLite) as the
contract's operator and referee, served in this process; provider agents,
a verifier and the job's workers as separate processes; a submitter that
funds a job on chain and posts it. The scenario's schedule then reclaims a
spot provider (a notice, a graceful leave), kills a machine without notice
and brings a new provider online, while one provider cheats on some of its
steps. At the end the job is settled, the chain moved past the dispute
window, every provider paid out, and the report written.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eth_account import Account

from shoal.client.http import CoordinatorClient
from shoal.coordinator import Coordinator, CoordinatorSettings
from shoal.coordinator.services.settlement import Settlement
from shoal.demo.cast import Processes, ServedCoordinator, write_key
from shoal.demo.chain import DISPUTE_WINDOW_S, DemoChain
from shoal.errors import ControlError
from shoal.spec.coordinator import ENDED, Grant, JobStatus, JobSubmission, Registration, Role
from shoal.spec.demo import EventKind, Scenario, ScenarioEvent

log = logging.getLogger(__name__)
QUICK_STEPS = 300  # --quick: the job's steps (events at steps come proportionally sooner)
START_TIMEOUT_S = 180.0  # agents' pre-flight, offers, the first committed step
VERIFIER_TIMEOUT_S = 180.0  # after the job's end, for the last epochs' audits
STATIC_TIMEOUT_S = 300.0  # the static reference run


def load_scenario(path: Path) -> Scenario:
    try:
        return Scenario.model_validate(tomllib.loads(path.read_text()))
    except FileNotFoundError:
        raise ControlError(f"no scenario file {path}; see examples/scenarios/") from None
    except (tomllib.TOMLDecodeError, ValueError) as error:
        raise ControlError(f"{path}: {error}") from None


@dataclass
class FiredEvent:
    event: ScenarioEvent
    t: float  # wall time it was carried out


@dataclass
class DemoState:
    """What the live view shows; updated every tick."""

    phase: str = "starting"
    job_id: str | None = None
    started_t: float | None = None  # wall time of the first committed step
    committed: int = 0  # steps committed so far
    fired: list[FiredEvent] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    marks: list = field(default_factory=list)  # the job's events the live view lists
    marks_after: int = 0  # the audit log read so far (the full demo records thousands)


@dataclass(frozen=True)
class DemoOptions:
    scenario_path: Path
    run_dir: Path
    quick: bool = False
    dashboard: bool = False
    tick: Callable[[Demo], None] = lambda demo: None  # the live view, called each tick


class Demo:
    def __init__(self, options: DemoOptions, replayer: Callable) -> None:
        self.options, self.replayer = options, replayer
        self.scenario = load_scenario(options.scenario_path)
        self.run_dir = options.run_dir
        self.state = DemoState()
        self.job_text = self._job_file()
        self.chain: DemoChain | None = None
        self.coordinator: Coordinator | None = None
        self.served: ServedCoordinator | None = None
        self.processes: Processes | None = None
        self.chain_job: int | None = None
        self.addresses: dict[str, str] = {}  # provider name -> address
        self.earned: dict[str, int] = {}  # address -> wei its lease earned (0: slashed)
        self.credited: dict[str, int] = {}  # address -> wei the payout credited it
        self.slashed: set[str] = set()
        self.refunded = 0  # wei credited back to the submitter (unspent escrow, slash shares)
        self.booked: dict[str, int] = {}  # address -> seconds the chain booked
        self.static_report: dict | None = None  # the static reference run's ElasticReport

    def _job_file(self) -> str:
        path = (self.options.scenario_path.parent / self.scenario.job).resolve()
        if not path.exists():
            raise ControlError(f"the scenario's job file {path} does not exist")
        values = tomllib.loads(path.read_text())
        steps = self.scenario.steps or values["steps"]
        if self.options.quick:
            steps = min(steps, QUICK_STEPS)
        self.steps, self.step_scale = steps, steps / values["steps"]
        text = path.read_text()
        return text.replace(f"steps = {values['steps']}\n", f"steps = {steps}\n", 1)

    @property
    def url(self) -> str:
        return self.served.url

    # ------------------------------------------------------------ the run
    def run(self) -> None:
        """Start everything, carry out the schedule, settle and pay out. The caller builds
        the report from what is left, then calls `close` (also on failure)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._start()
        self._drive()
        self._finish()

    def _start(self) -> None:
        s = self.state
        s.phase = "chain"
        self.chain = chain = DemoChain(len(self.scenario.providers))
        parties = chain.parties
        admin = Account.create()
        keys = self.run_dir / "keys"
        settings = CoordinatorSettings(
            store_url=f"sqlite:///{self.run_dir / 'coordinator' / 'store.db'}",
            data_dir=self.run_dir / "coordinator", port=0, audience="shoal-demo",
            operators=(admin.address,), heartbeat_s=0.5, agent_timeout_s=3.0,
            clear_interval_s=0.5, **({"dashboard": True} if self.options.dashboard else {}))
        (self.run_dir / "coordinator").mkdir(parents=True, exist_ok=True)
        s.phase = "coordinator"
        self.coordinator = Coordinator(settings, settlement=Settlement(chain.ledger, parties.operator),
                                       referee_key=parties.referee, replayer=self.replayer)
        self.served = ServedCoordinator(self.coordinator)
        log.info("coordinator at %s%s", self.url,
                 f"; dashboard: {self.url}/dashboard" if self.options.dashboard else "")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
        self.processes = Processes(self.run_dir, env)
        s.phase = "providers"
        for provider, account in zip(self.scenario.providers, parties.providers):
            self.addresses[provider.name] = account.address
            write_key(keys / f"{provider.name}.key", account)
            if provider.start:
                self.processes.agent(provider, self.url, keys / f"{provider.name}.key",
                                     (self.chain.chain.chain_id, self.chain.ledger.address))
        starting = sum(1 for p in self.scenario.providers if p.start)
        self.submitter = CoordinatorClient(self.url, parties.submitter)
        self._wait(lambda: sum(len(p.offers) for p in self.submitter.providers()) >= starting,
                   START_TIMEOUT_S, "the providers' pre-flights and offers")
        s.phase = "submitting"
        self.submitter.register(Registration(role="submitter", name="submitter"))
        self.whistleblower = parties.whistleblower
        for account, name in ((parties.verifier, "verifier"), (self.whistleblower, "whistle")):
            CoordinatorClient(self.url, admin).request("POST", "/v1/grants", Grant(
                address=account.address, role=Role.verifier, name=name))
        sc = self.scenario
        self.chain_job = chain.ledger.create_job(parties.submitter, sc.max_price_wei_per_s,
                                                 sc.budget_wei).returned
        job = self.submitter.submit(JobSubmission(
            name="demo", job_file=self.job_text, workers=sc.workers, min_workers=sc.min_workers,
            max_price_wei_per_s=sc.max_price_wei_per_s, budget_wei=sc.budget_wei,
            chain_job=self.chain_job))
        s.job_id = job.job_id
        self.processes.start("verifier", "verify", "--coordinator", self.url, "--job", job.job_id,
                             "--key", str(write_key(keys / "verifier.key", parties.verifier)),
                             "--follow", "--rate", str(sc.verify_rate), "--interval-s", "1",
                             "--answer-wait-s", "20", "--json")
        s.phase = "training"

    def _drive(self) -> None:
        """Carry out the schedule while the job runs; return when it has ended."""
        s = self.state
        pending = list(self.scenario.events)
        keys = self.run_dir / "keys"
        while True:
            job = self.submitter.job(s.job_id)
            done = self.coordinator.progress.steps(s.job_id, after=s.committed - 1)
            if done:
                s.started_t = s.started_t or done[0].t
                s.committed = done[-1].step + 1
            # The job's host sees each commit at once; the agents' progress reports come
            # in batches, and a loaded machine can delay them by tens of seconds.
            reached = self.coordinator.records.host_reached(s.job_id)
            if s.started_t is not None and reached is not None:
                s.committed = max(s.committed, reached + 1)
            # In order, one at a time: a fault lands on a job that has recovered from the
            # one before (see `_due`), as the schedule means it to.
            while pending and self._due(pending[0]) and job.status not in ENDED:
                self._fire_logged(pending.pop(0), keys)
            self.options.tick(self)
            if job.status in ENDED:
                if job.status is not JobStatus.finished:
                    raise ControlError(f"the demo job {job.status.value}; see "
                                       f"{self.run_dir / 'logs'} and `shoal events {s.job_id}`")
                for event in pending:  # the job outran them: still carried out, and the
                    self._fire_logged(event, keys)  # report marks them after the end
                return
            time.sleep(0.5)

    def _fire_logged(self, event: ScenarioEvent, keys: Path) -> None:
        self._fire(event, keys)
        self.state.fired.append(FiredEvent(event, time.time()))

    def _due(self, event: ScenarioEvent) -> bool:
        s = self.state
        if s.started_t is None:
            return False
        if event.kind is not EventKind.join and not self._at_strength():
            # A machine lost while the last one's replacement is still starting (20 s or
            # more on a loaded machine) could take the job's last live state with it.
            return False
        if event.at_step is not None:
            return s.committed >= max(1, round(event.at_step * self.step_scale))
        return time.time() >= s.started_t + event.at_s

    def _at_strength(self) -> bool:
        """Whether the job's newest membership has the scenario's number of workers."""
        epochs = self.coordinator.progress.membership(self.state.job_id)
        return bool(epochs) and len(epochs[-1].members) >= self.scenario.workers

    def _fire(self, event: ScenarioEvent, keys: Path) -> None:
        provider = next(p for p in self.scenario.providers if p.name == event.provider)
        if event.kind is EventKind.preempt:
            self.processes.notice(provider.name)
        elif event.kind is EventKind.kill:
            self.processes.kill(provider.name)
        else:
            self.processes.agent(provider, self.url, keys / f"{provider.name}.key",
                                 (self.chain.chain.chain_id, self.chain.ledger.address))
        self.state.notes.append(f"{event.kind.value}: {provider.name}")
        log.info("scenario: %s %s", event.kind.value, provider.name)

    def _finish(self) -> None:
        s = self.state
        s.phase = "auditing"
        self._await("verifier", VERIFIER_TIMEOUT_S)
        # The whistleblower re-audits what the verifier judged: a `valid` on a cheat's work
        # would be upheld against the cheat and cost the verifier its stake.
        s.phase = "rechecking"
        self.processes.start("whistleblower", "verify", "--coordinator", self.url, "--job",
                             s.job_id, "--key",
                             str(write_key(self.run_dir / "keys" / "whistleblower.key",
                                           self.whistleblower)),
                             "--recheck", "--answer-wait-s", "10", "--json")
        self._await("whistleblower", VERIFIER_TIMEOUT_S)
        self.coordinator.referee.wait()
        s.phase = "paying"
        self.processes.stop_all()
        self.served.stop()
        chain, ledger = self.chain.chain, self.chain.ledger
        chain.advance_time(DISPUTE_WINDOW_S + 1)
        leases = {a: ledger.lease(self.chain_job, a) for a in self.addresses.values()}
        # What each lease earned, read before the payout clears its booking.
        self.earned = {a: lease.earned_wei for a, lease in leases.items()}
        self.booked = {a: lease.verified_s for a, lease in leases.items()}
        self.slashed = {a for a, lease in leases.items() if lease.slashed}
        accepted = [a for a, lease in leases.items() if lease.accepted_at]
        credit_before = {a: ledger.credit_of(a) for a in self.addresses.values()}
        if accepted:
            ledger.payout(self.chain.parties.operator, self.chain_job, accepted)
        self.credited = {a: ledger.credit_of(a) - credit_before[a] for a in self.addresses.values()}
        # The submitter's refund (unspent escrow, and a slashed cheat's pay) is credited too.
        self.refunded = ledger.credit_of(self.chain.parties.submitter.address)
        for account in (*self.chain.parties.providers, self.chain.parties.submitter):
            if ledger.credit_of(account.address):
                ledger.withdraw(account)
        if not self.options.quick:
            s.phase = "static run"
            self.options.tick(self)
            self._static_run()
        s.phase = "done"
        self.options.tick(self)

    def _static_run(self) -> None:
        """The reference EF is measured against: the same job on `workers` workers of this
        machine, never faulted, started together (`shoal train --workers N`), billed at
        the on-demand reference price."""
        folder = self.run_dir / "static"
        folder.mkdir(parents=True, exist_ok=True)
        job = folder / "job.toml"
        job.write_text(self.job_text)
        process = self.processes.start(
            "static", "train", str(job), "--workers", str(self.scenario.workers), "--fresh",
            "--run-dir", str(folder / "run"), "--checkpoint-dir", str(folder / "checkpoints"),
            "--proof-dir", str(folder / "proof"), "--report", str(folder / "report.json"))
        try:
            process.wait(timeout=STATIC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.processes.kill("static")
        report = folder / "report.json"
        if process.returncode == 0 and report.exists():
            self.static_report = json.loads(report.read_text())
        else:
            self.state.notes.append("the static reference run failed; EF is estimated")
            log.warning("the static reference run failed (see %s); EF is estimated",
                        self.run_dir / "logs" / "static.log")

    def _await(self, name: str, timeout_s: float) -> None:
        process = self.processes.running[name]
        deadline = time.monotonic() + timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            self.options.tick(self)
            time.sleep(0.5)
        if process.poll() is None:
            self.state.notes.append(f"{name} still auditing after {timeout_s:.0f} s; stopped")
            log.warning("%s did not finish within %.0f s; stopping it", name, timeout_s)

    def _wait(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise ControlError(f"demo: {what} did not happen within {timeout_s:.0f} s; see "
                                   f"the logs under {self.run_dir / 'logs'}")
            self.options.tick(self)
            time.sleep(0.5)

    def close(self) -> None:
        if self.processes is not None:
            self.processes.stop_all(grace_s=5.0)
        if self.served is not None and self.served.thread.is_alive():
            self.served.stop()
        if self.coordinator is not None:
            self.coordinator.hosts.stop_all()
            self.coordinator.engine.dispose()
