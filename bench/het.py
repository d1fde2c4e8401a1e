"""Heterogeneity efficiency: the tiny GPT trained elastically on four workers
whose speeds are 1 : 1 : 0.5 : 0.25, made real by cgroup CPU caps.

    .venv/bin/python -m bench.het          # root; prints one JSON line

eta_het = the job's samples/s over the sum of each worker's own samples/s
measured alone, under the same cap and the same job settings (one worker,
the whole global batch). The reference in the same run is the same job with
rebalancing off (equal shares), over the same alone figures. Each worker is
started inside its cap by a wrapper (tests/harness/cgroups.entering); the
runtime is unchanged and measures speeds and sets shares on its own. The
caps sit in a slice weighted above the machine's other work, so on a shared
machine a cap, not the neighbours, sets each worker's speed: the CPU each
cap used over the measured window is in the JSON to show it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch loads: see shoal.cli.main

from shoal.spec import JobSpec, load_job  # noqa: E402
from shoal.spec.elastic import StepRecord  # noqa: E402
from shoal.elastic.report import lineage  # noqa: E402
from shoal.elastic.launcher import LaunchConfig, Launcher  # noqa: E402
from shoal.train.run_config import RunSettings  # noqa: E402
from shoal.train.step_log import read_step_logs  # noqa: E402

from bench.history import RECORD_HELP, append_result  # noqa: E402
from tests.harness.cgroups import CgroupUnavailable, CpuCap, CpuSlice, entering  # noqa: E402

JOB = Path(__file__).resolve().parent.parent / "examples" / "tiny-gpt.toml"
# Speeds 1 : 1 : 0.5 : 0.25 would be 2.75 cores at one core for the fastest; this machine
# has 2, shared, so the fastest gets 0.4 of a core and the rest scale with it (1.1 cores).
CAPS_CORES = (0.4, 0.4, 0.2, 0.1)
THREADS = 1  # torch threads per worker: one core's worth at most, whatever the cap


@dataclass(frozen=True)
class Settings:
    global_batch: int
    micro_batch: int
    steps: int  # elastic runs (the balanced one and the equal-shares one)
    warmup: int  # steps left out of the elastic rates: start-up and shares settling
    equal_steps: int
    equal_warmup: int
    alone_steps: int
    alone_warmup: int
    period_s: float  # CFS period of the caps
    priority: float  # weight of the caps' slice against the machine's other work
    rebalance: int  # the runtime's rebalance_interval (steps)
    record: bool  # append the result to bench/results/het.jsonl


def parse() -> Settings:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--equal-steps", type=int, default=12)
    p.add_argument("--equal-warmup", type=int, default=3)
    p.add_argument("--alone-steps", type=int, default=10,
                   help="steps of the fastest worker alone; slower ones run fewer, in about "
                        "the same time")
    p.add_argument("--alone-warmup", type=int, default=1)
    p.add_argument("--period-s", type=float, default=0.01)
    p.add_argument("--priority", type=float, default=16.0)
    p.add_argument("--rebalance", type=int, default=20, help="the runtime's default")
    p.add_argument("--record", action="store_true", help=RECORD_HELP)
    a = p.parse_args()
    return Settings(a.global_batch, a.micro_batch, a.steps, a.warmup, a.equal_steps,
                    a.equal_warmup, a.alone_steps, a.alone_warmup, a.period_s, a.priority,
                    a.rebalance, a.record)


def bench_job(settings: Settings, steps: int, scratch: Path) -> JobSpec:
    """The tiny GPT of examples/tiny-gpt.toml at the benchmark's batch; checkpoints and the
    final evaluation kept out of the way (they are not what is measured)."""
    job = load_job(JOB, overrides={"steps": steps})
    return job.model_copy(update={
        "name": "het-bench", "global_batch": settings.global_batch,
        "micro_batch": settings.micro_batch, "eval_batches": 1,
        "checkpoint": job.checkpoint.model_copy(update={"dir": str(scratch / "ckpt"),
                                                        "interval_steps": 1_000_000}),
    })


class UsageSampler:
    """CPU seconds used by each cap, sampled in the background, read over a window."""

    def __init__(self, caps: list[CpuCap], every_s: float = 0.25) -> None:
        self.caps, self.every_s = caps, every_s
        self.samples: list[tuple[float, list[float | None]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), [c.usage_s() for c in self.caps]))
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cores(self, t0: float, t1: float) -> list[float | None]:
        """Cores each cap used between t0 and t1 (nearest samples inside the window)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return [None] * len(self.caps)
        (ta, a), (tb, b) = inside[0], inside[-1]
        return [None if x is None or y is None else round((y - x) / (tb - ta), 3)
                for x, y in zip(a, b)]


@dataclass(frozen=True)
class Measured:
    samples_per_s: float
    steps: int  # steps in the window
    step_s: float  # mean step time in the window
    cores: list[float | None]  # CPU each cap used over the window
    shares: dict[str, list[int]]  # worker -> its shares over the window (min, max)
    epochs: int


def launch(settings: Settings, caps: list[CpuCap], steps: int, warmup: int,
           rebalance: int) -> Measured:
    """One run of the job on len(caps) workers, worker i inside caps[i], re-weighting
    shares every `rebalance` steps (0: never)."""
    with tempfile.TemporaryDirectory(prefix="shoal-het-") as scratch_name:
        scratch = Path(scratch_name)
        job = bench_job(settings, steps, scratch)
        run_dir = scratch / "run"
        config = LaunchConfig(
            command=entering([sys.executable, "-m", "shoal.models.gpt_worker",
                              "--job-json", job.model_dump_json()]),
            workers=len(caps), run_dir=run_dir, timeout_s=1800.0,
            worker_env={i: cap.env() for i, cap in enumerate(caps)},
            settings=RunSettings(checkpoint_dir=job.checkpoint_dir, identity=job.resume_identity(),
                                 checkpoint_interval=job.checkpoint.interval_steps,
                                 rebalance_interval=rebalance),
            env={"OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS)})
        sampler = UsageSampler(caps)
        try:
            report = Launcher(config).run()
        finally:
            sampler.stop()
        records = read_step_logs(run_dir)
    return measure(lineage(records), records, warmup, sampler, report.epochs if report else 0)


def measure(steps: list[StepRecord], records: list[StepRecord], warmup: int,
            sampler: UsageSampler, epochs: int) -> Measured:
    """Samples/s from the commit of step `warmup` to the last commit (steps after it)."""
    kept = [r for r in steps if r.step >= warmup]
    if len(kept) < 2:
        raise RuntimeError(f"only {len(kept)} steps after a warm-up of {warmup}; raise --steps")
    t0, t1 = kept[0].t_commit, kept[-1].t_commit
    samples = sum(sum(r.shares) for r in kept[1:])
    shares: dict[str, list[int]] = {}
    for r in records:
        if r.step > kept[0].step:
            shares.setdefault(r.worker, []).append(r.shares[r.rank])
    return Measured(round(samples / (t1 - t0), 3), len(kept) - 1,
                    round((t1 - t0) / (len(kept) - 1), 3), sampler.cores(t0, t1),
                    {w: [min(s), max(s)] for w, s in sorted(shares.items())}, epochs)


def main() -> None:
    settings = parse()
    try:
        slice_ = CpuSlice("het", priority=settings.priority)
    except CgroupUnavailable as error:
        sys.exit(f"bench/het.py needs real CPU caps: {error}")
    with slice_:
        # The launcher (rendezvous store, authority) gets the slice's weight but no cap.
        slice_.cap("launcher", cores=None).add(os.getpid())
        caps = [slice_.cap(f"w{i}", cores, settings.period_s) for i, cores in enumerate(CAPS_CORES)]
        balanced = launch(settings, caps, settings.steps, settings.warmup, settings.rebalance)
        equal = launch(settings, caps, settings.equal_steps, settings.equal_warmup, rebalance=0)
        alone = [launch(settings, [cap], alone_steps(settings, cores), settings.alone_warmup,
                        settings.rebalance)
                 for cap, cores in zip(caps, CAPS_CORES)]
    result = figures(settings, balanced, equal, alone)
    print(json.dumps(result))
    if settings.record:
        append_result("het", result)


def alone_steps(settings: Settings, cores: float) -> int:
    """Steps for one worker alone: `alone_steps` for the fastest cap and fewer for slower
    ones, so each is measured over about the same time (a 0.1-core worker takes ~40 s a
    step at the default batch); never fewer than three measured steps."""
    return max(settings.alone_warmup + 4, round(settings.alone_steps * cores / max(CAPS_CORES)))


def share_bound(shares: dict[str, list[int]], alone: list[float]) -> float | None:
    """The eta_het these shares allow at best: each worker at its alone rate, the step as
    long as the slowest share (no exchange, no commit). None when the shares moved."""
    if any(low != high for low, high in shares.values()) or len(shares) != len(alone):
        return None
    step_s = max(shares[f"w{i}"][0] / rate for i, rate in enumerate(alone))
    return round(sum(s[0] for s in shares.values()) / step_s / sum(alone), 4)


def figures(settings: Settings, balanced: Measured, equal: Measured,
            alone: list[Measured]) -> dict[str, object]:
    total = sum(m.samples_per_s for m in alone)
    rates = [m.samples_per_s for m in alone]
    return {
        "bench": "het",
        "eta_het": round(balanced.samples_per_s / total, 4),
        "eta_het_equal_shares": round(equal.samples_per_s / total, 4),
        # Where the gap to 1.0 comes from: the shares the runtime chose, against shares
        # proportional to the alone rates.
        "eta_bound_of_shares": share_bound(balanced.shares, rates),
        "shares_proportional": [round(settings.global_batch * r / total, 1) for r in rates],
        "achieved_samples_per_s": balanced.samples_per_s,
        "equal_shares_samples_per_s": equal.samples_per_s,
        "alone_samples_per_s": [m.samples_per_s for m in alone],
        "alone_sum_samples_per_s": round(total, 3),
        "speeds_relative": [round(m.samples_per_s / alone[0].samples_per_s, 3) for m in alone],
        "caps_cores": list(CAPS_CORES),
        "caps_note": "speeds 1:1:0.5:0.25 scaled to fit a shared 2-core machine: CFS quota "
                     "of 0.4/0.4/0.2/0.1 of a core per worker, one torch thread each",
        "cores_used": {"balanced": balanced.cores, "equal": equal.cores,
                       "alone": [m.cores[0] for m in alone]},
        "shares_in_window": balanced.shares,
        "step_s": {"balanced": balanced.step_s, "equal": equal.step_s,
                   "alone": [m.step_s for m in alone]},
        "steps_measured": {"balanced": balanced.steps, "equal": equal.steps,
                           "alone": [m.steps for m in alone]},
        "epochs": {"balanced": balanced.epochs, "equal": equal.epochs},
        "settings": {
            "model": "examples/tiny-gpt.toml (4 layers, width 128, context 128, 0.84M params)",
            "global_batch": settings.global_batch, "micro_batch": settings.micro_batch,
            "steps": settings.steps, "warmup_steps": settings.warmup,
            "equal_steps": settings.equal_steps, "equal_warmup_steps": settings.equal_warmup,
            "alone_steps": [alone_steps(settings, cores) for cores in CAPS_CORES],
            "alone_warmup_steps": settings.alone_warmup,
            "rebalance_interval": settings.rebalance, "threads_per_worker": THREADS,
            "cfs_period_s": settings.period_s, "slice_priority": settings.priority,
            "backend": "gloo on loopback",
        },
    }


if __name__ == "__main__":
    main()
