"""Running shoal itself for the benchmarks: one launch of the bench model on
N workers with a fault schedule, and throughput read from its step logs the
same way the references' throughput is read from theirs."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch loads: see shoal.cli.main

from shoal.spec import load_job  # noqa: E402
from shoal.spec.elastic import ElasticReport, StepRecord
from shoal.control.chaos import parse_chaos
from shoal.control.elastic_report import lineage
from shoal.control.launcher import Launcher, LaunchConfig
from shoal.train.step_log import read_step_logs


def run_shoal(job_path: str, workers: int, steps: int, chaos: str = "",
              extra_env: dict[str, str] | None = None, timeout_s: float = 900.0,
              spares: int = 0) -> tuple[ElasticReport, list[StepRecord]]:
    job = load_job(job_path, overrides={"steps": steps})
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as scratch:
        run_dir = Path(scratch) / "run"
        config = LaunchConfig(
            command=[sys.executable, "-m", "shoal.jobs.gpt_worker", "--job-json", job.model_dump_json()],
            workers=workers, run_dir=run_dir, chaos=parse_chaos(chaos), timeout_s=timeout_s,
            spares=spares,
            env={"SHOAL_CHECKPOINT_DIR": str(Path(scratch) / "ckpt"),
                 "SHOAL_CHECKPOINT_INTERVAL": str(job.checkpoint.interval_steps),
                 "SHOAL_IDENTITY": json.dumps(job.resume_identity()), **(extra_env or {})},
        )
        report = Launcher(config).run()
        return report, lineage(read_step_logs(run_dir))


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
