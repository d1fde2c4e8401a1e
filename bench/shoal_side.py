"""Running shoal itself for the benchmarks: one launch of the bench model on
N workers with a fault schedule, and throughput read from its step logs the
same way the references' throughput is read from theirs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch loads: see shoal.cli.main

from shoal.spec import JobSpec, load_job  # noqa: E402
from shoal.spec.elastic import ElasticReport, StepRecord
from shoal.elastic.chaos import parse_chaos
from shoal.elastic.report import lineage
from shoal.elastic.launcher import Launcher, LaunchConfig
from shoal.train.run_config import RunSettings
from shoal.train.step_log import read_step_logs

from bench.fault_plan import Applied, FaultPlan, drive
from bench.figures import Commit


def run_shoal(job_path: str, workers: int, steps: int, chaos: str = "",
              timeout_s: float = 900.0, spares: int = 0) -> tuple[ElasticReport, list[StepRecord]]:
    job = load_job(job_path, overrides={"steps": steps})
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as scratch:
        run_dir = Path(scratch) / "run"
        config = LaunchConfig(
            command=[sys.executable, "-m", "shoal.models.gpt_worker", "--job-json", job.model_dump_json()],
            workers=workers, run_dir=run_dir, chaos=parse_chaos(chaos), timeout_s=timeout_s,
            spares=spares, settings=_run_settings(job, Path(scratch) / "ckpt"),
        )
        report = Launcher(config).run()
        return report, lineage(read_step_logs(run_dir))


def _run_settings(job: JobSpec, checkpoint_dir: Path) -> RunSettings:
    return RunSettings(checkpoint_dir=str(checkpoint_dir), identity=job.resume_identity(),
                       checkpoint_interval=job.checkpoint.interval_steps)


def samples_per_s(steps: list[StepRecord], warmup_steps: int) -> float:
    """Samples committed per second after the first `warmup_steps` steps."""
    kept = [r for r in steps if r.step >= warmup_steps]
    if len(kept) < 2:
        raise RuntimeError("too few steps after warm-up to measure throughput")
    samples = sum(sum(r.shares) for r in kept[1:])
    return samples / (kept[-1].t_commit - kept[0].t_commit)


def steps_per_s(steps: list[StepRecord], warmup_steps: int) -> float:
    kept = [r for r in steps if r.step >= warmup_steps]
    return (len(kept) - 1) / (kept[-1].t_commit - kept[0].t_commit)


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


@contextlib.contextmanager
def scratch_dir(prefix: str):
    """A temporary directory, kept (and its path logged) when SHOAL_BENCH_KEEP=1, to debug."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        if os.environ.get("SHOAL_BENCH_KEEP") == "1":
            print(f"[bench] kept {path}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(path, ignore_errors=True)


def shoal_detection(stall_deadline_s: float) -> dict[str, float]:
    """shoal's detection settings, as its launcher runs them."""
    from shoal.elastic.liveness import LivenessConfig

    live = LivenessConfig(floor_s=stall_deadline_s)
    return {"liveness_floor_s": live.floor_s, "liveness_step_multiple": live.step_multiple,
            "liveness_margin_s": live.margin_s, "exit_reported_by_launcher": True}


class ShoalTarget:
    """A one-host shoal launcher (in a thread of this process) as the fault driver's target.

    A fault's replacement is the launcher's own `join` chaos event, scheduled 20 ms after
    the fault so that it always lands after it; with spares > 0 it calls in a warm spare.
    """

    def __init__(self, launcher, run_dir: Path) -> None:
        self.launcher, self.run_dir = launcher, run_dir
        self.launch_t = 0.0
        self.outcome: dict[str, object] = {}
        self.thread = threading.Thread(target=self._run, name="shoal-launcher", daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.time() + 60
        while not (self.run_dir / "launch.json").exists():
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the shoal launcher did not start: {self.outcome}")
            time.sleep(0.01)
        time.sleep(0.01)  # written in one call; give it a moment to be complete
        self.launch_t = json.loads((self.run_dir / "launch.json").read_text())["t0"]

    def _run(self) -> None:
        try:
            self.outcome["report"] = self.launcher.run()
        except BaseException as error:  # handed to the driver's thread through healthy()
            self.outcome["error"] = error

    def healthy(self) -> None:
        if "error" in self.outcome:
            raise RuntimeError(f"shoal failed: {self.outcome['error']}")
        if not self.thread.is_alive():
            raise RuntimeError("shoal finished before the fault plan did; raise the step count")

    def victim_pids(self, rank: int, whole_host: bool) -> list[int]:
        if whole_host:
            raise ValueError("host-kill needs hosts: run it with the namespaced placement")
        # The process this launcher holds for the worker: workers are forked from a
        # preloaded interpreter (shoal.elastic.preload), so /proc/PID/environ is the fork
        # server's and names no worker.
        worker = _last_epoch(self.run_dir)["members"][rank]
        process = self.launcher.pool.workers.get(worker)
        if process is None or not process.alive():
            raise RuntimeError(f"no live process of shoal worker {worker}")
        return [process.pid]

    def partition(self, rank: int) -> None:
        raise ValueError("partition needs hosts: run it with the namespaced placement")

    def replace(self, k: int) -> None:
        pass  # the launcher's join event (see the class docstring)

    def finish(self, timeout_s: float) -> ElasticReport:
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise RuntimeError(f"shoal did not finish within {timeout_s:.0f} s of the plan's end")
        if "error" in self.outcome:
            raise RuntimeError(f"shoal failed: {self.outcome['error']}")
        return self.outcome["report"]  # type: ignore[return-value]


def _last_epoch(run_dir: Path) -> dict:
    lines = (run_dir / "epochs.jsonl").read_text().splitlines()
    return json.loads([line for line in lines if line.strip()][-1])


def shoal_under_plan(job_path: str, plan: FaultPlan, steps: int, spares: int,
                     stall_deadline_s: float) -> tuple[ElasticReport, list[Commit], list[Applied], float]:
    """Run shoal through `plan` (launcher on this host); the run ends after `steps` steps."""
    job = load_job(job_path, overrides={"steps": steps})
    joins = [f"join@{plan.at_s(k) + 0.02:g}s" for k in range(plan.count) if plan.fault.removes_worker]
    with scratch_dir("shoal-bench-") as scratch:
        run_dir = Path(scratch) / "run"
        config = LaunchConfig(
            command=[sys.executable, "-m", "shoal.models.gpt_worker", "--job-json", job.model_dump_json()],
            workers=plan.workers, run_dir=run_dir, chaos=parse_chaos(",".join(joins)),
            timeout_s=plan.end_s * 4 + 300, spares=spares, stall_deadline_s=stall_deadline_s,
            settings=_run_settings(job, Path(scratch) / "ckpt"),
        )
        target = ShoalTarget(Launcher(config), run_dir)
        target.start()
        applied = drive(plan, target)
        report = target.finish(timeout_s=plan.end_s * 3 + 300)
        commits = [Commit(r.step, r.t_start, r.t_commit, r.world, r.epoch) for r in read_step_logs(run_dir)]
        return report, commits, applied, target.launch_t
