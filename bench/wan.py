"""Training over a slow network (issue 11): the tiny GPT on 4 workers, each on a
network-namespaced host of its own (tests/harness), once on a fast emulated
network and once on one 100x slower in both rate and latency, each with the
sync mode and codec the planner (shoal.plan) chooses for a 4-device cluster
with those links.

Figures: `slowdown` (time to a fixed validation loss, slow over fast; training
time from the commit of step 0, evaluations subtracted),
`bytes_ratio` (exchange bytes sent per worker on the slow network over those
of plain every-step all-reduce for the same steps, counted in the exchange by
the ring model; `wire_bytes_ratio` is the same from the hosts' bridge-port
counters, store and vote traffic included) and `loss_gap` (final validation
loss on the slow network minus plain all-reduce's on the fast one). Targets: slowdown <= 1.2,
bytes_ratio <= 1/1000, loss_gap <= 0.03 nats.

Links go through the harness's userspace emulator (Host.emulate: this kernel
has no netem): every host's link, both ways, has the rate, half the host-to-host
one-way latency (a packet crosses the sender's link and the receiver's) and a
drop-tail queue of 100 ms of backlog (one round trip of the slow network: its
bandwidth-delay product). Fast: 1000 Mbit/s, 0.5 ms one way between hosts (the
planner's default within a region). Slow: 10 Mbit/s, 50 ms (RTT 100 ms, about
a transatlantic path). The slow links have the WAN's 1500-byte MTU, so TCP's
slow start and loss recovery on its 100 ms round trips count in real-size
segments; the fast links have a 65,000-byte MTU: on a 1 ms round trip TCP
behaves much the same with either, and at 1500 bytes the forwarders would move
83,000 frames/s at line rate and take the CPU the training needs (making the
fast run slower and the slowdown flattering). The JSON states the settings and
the forwarders' CPU seconds in each run. The planner is given the same rates
and latencies.

    .venv/bin/python -m bench.wan [--steps 300] [--fast-mbit 1000] [--fast-latency-ms 0.5] [--target 2.6]
                                  [--min-rounds 6]

Needs root. Prints progress to stderr and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.history import RECORD_HELP, append_result
from bench.shoal_side import scratch_dir
from shoal.spec import load_job
from shoal.spec.job import SyncSpec
from shoal.spec.plan import Cluster, Device, SyncMode, gpt_profile
from shoal.train.step_log import read_step_logs
from tests.harness.hosts_job import hosts_job
from tests.harness.netns import Network, ensure_tools

JOB = "examples/tiny-gpt.toml"
WORKER = Path(__file__).with_name("wan_worker.py")
WORKERS = 4
TARGETS = {"slowdown_max": 1.2, "bytes_ratio_max": 1 / 1000, "loss_gap_max": 0.03}
QUEUE_MS = 100.0  # drop-tail, per direction of each host's link
RUNTIME_ENV = {"SHOAL_REBALANCE": "0", "TORCH_CPP_LOG_LEVEL": "ERROR"}
MTU = {"fast": 65000, "slow": 1500}  # why they differ: see the docstring


@dataclass(frozen=True)
class Wan:
    """One emulated network: every pair of hosts sees `mbit` and `latency_ms` one way."""

    mbit: float
    latency_ms: float
    mtu: int

    def settings(self) -> dict:
        return {"link_mbit": self.mbit, "latency_ms": self.latency_ms, "mtu": self.mtu,
                "queue_ms": QUEUE_MS}


def log(message: str) -> None:
    print(f"[bench.wan] {message}", file=sys.stderr, flush=True)


def emulate(network: Network, wan: Wan) -> None:
    """Every host's link at `wan`'s rate, with half its host-to-host latency each way."""
    for host in network.hosts:
        host.emulate(delay_ms=wan.latency_ms / 2, rate_mbit=wan.mbit, queue_ms=QUEUE_MS, mtu=wan.mtu)


def forwarder_cpu_s(network: Network) -> float:
    """CPU seconds the hosts' link forwarders have used (their own processes, not the training's)."""
    ticks = 0
    for host in network.hosts:
        fields = Path(f"/proc/{host.forwarder.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def sent_by_hosts(network: Network) -> list[int]:
    """Bytes each host has sent (what its bridge port received)."""
    return [int(Path(f"/sys/class/net/{h.link}/statistics/rx_bytes").read_text())
            for h in network.hosts]


def calibrate_tflops(job) -> float:
    """Achieved TFLOP/s of one worker on this machine (forward and backward of its share,
    one thread, times the share of the cores a worker gets when all four run)."""
    import torch

    from shoal.models.model import GPT

    torch.set_num_threads(1)
    model = GPT(job.model)
    batch = torch.randint(0, 256, (job.global_batch // WORKERS, job.model.context + 1))
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        (model.loss_sum(batch) / len(batch)).backward()
        times.append(time.perf_counter() - t0)
    profile = tiny_profile(job)
    per_s = len(batch) / sorted(times)[1]
    return per_s * profile.flops_per_sample / 1e12 * min(1.0, (os.cpu_count() or 1) / WORKERS)


def tiny_profile(job):
    """The job's GPT as the planner sees it, with float32 gradients (what the runtime sends)."""
    m = job.model
    profile = gpt_profile("tiny-gpt", layers=m.layers, width=m.width, context=m.context,
                          vocab=256, batch_samples=job.global_batch)
    return profile.model_copy(update={"gradient_bytes_per_parameter": 4.0})


def planned(job, tflops: float, wan: Wan, max_inner: int):
    """The planner's mode and codec for 4 devices on `wan`'s links. Data parallel only
    (the runtime has no pipeline execution yet), and DiLoCo rounds no longer than
    `max_inner` (the default ladder goes to H = 500, more than the whole run)."""
    from shoal.plan import CostConfig, SearchConfig, SyncConfig, plan

    devices = tuple(Device(name=f"h{i}", tflops=tflops, memory_gb=4.0) for i in range(WORKERS))
    n = len(devices)
    cluster = Cluster(devices=devices,
                      latency_ms=tuple(tuple(wan.latency_ms for _ in range(n)) for _ in range(n)),
                      bandwidth_gbps=tuple(tuple(wan.mbit / 1000 for _ in range(n)) for _ in range(n)))
    ladder = tuple(h for h in SyncConfig().inner_steps if h <= max_inner) or (max_inner,)
    config = SearchConfig(cost=CostConfig(efficiency=1.0, sync=SyncConfig(inner_steps=ladder)),
                          only_shapes=((WORKERS, 1),))
    return plan(cluster, tiny_profile(job), config)


def train(job, wan: Wan, scratch: Path, name: str) -> dict:
    """One run of `job` on 4 namespaced hosts with links emulated as `wan`."""
    network = Network()
    run_dir = scratch / name
    try:
        hj = hosts_job(network, [1] * WORKERS, run_dir)
        emulate(network, wan)
        before = sent_by_hosts(network)
        hj.start([str(WORKER), "--", "--job-json", job.model_dump_json()],
                 env=RUNTIME_ENV)
        codes = hj.wait(timeout_s=3600)
        wire = [b - a for a, b in zip(before, sent_by_hosts(network))]
        forwarders_s = forwarder_cpu_s(network)
        report = hj.report()
        hj.close()
    finally:
        network.close()
    if report["steps"] != job.steps:
        raise RuntimeError(f"{name}: {report['steps']} of {job.steps} steps (launchers: {codes})")
    if any(code != 0 for code in codes.values()):  # a launcher that saw its worker finish first
        log(f"{name}: launchers exited {codes} after all {job.steps} steps")
    records = read_step_logs(run_dir)
    # The clock starts when step 0 commits: process start-up and the first group's
    # connections are not training (they took up to 10 s on the slow links).
    start = min(r.t_commit for r in records if r.step == 0)
    per_worker: dict[str, int] = {}
    for r in records:
        per_worker[r.worker] = max(per_worker.get(r.worker, 0), r.bytes_sent or 0)
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    return {"records": records, "start": start, "evals": evals, "report": report,
            "bytes_per_worker": sum(per_worker.values()) / len(per_worker),
            "wire_per_worker": sum(wire[1:]) / (len(wire) - 1),  # h1..h3: h0 also serves the store
            "wall_s": max(r.t_commit for r in records) - start, "forwarder_cpu_s": round(forwarders_s, 1)}


def time_to(result: dict, target: float) -> float | None:
    """Training seconds until the first evaluation at or below `target` (evaluations
    themselves subtracted: everyone waits for rank 0 while it evaluates)."""
    spent = 0.0
    for e in result["evals"]:
        if e["val_loss"] <= target:
            return round(e["t"] - result["start"] - spent, 2)
        spent += e["eval_s"]
    return None


def sync_of(plan) -> dict:
    return {"mode": plan.mode.value, "inner_steps": plan.inner_steps, "codec": plan.codec.value,
            "slt": plan.slt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--fast-mbit", type=float, default=1000.0)
    parser.add_argument("--fast-latency-ms", type=float, default=0.5, help="one way, host to host")
    parser.add_argument("--slowdown-factor", type=float, default=100.0)
    parser.add_argument("--target", type=float, default=2.6, help="validation loss, nats/byte")
    parser.add_argument("--eval-interval", type=int, default=10)
    parser.add_argument("--min-rounds", type=int, default=6,
                        help="DiLoCo rounds the run must hold at least (caps the planner's H; "
                             "30 makes it choose SparseLoCo at H = 10 on the slow network)")
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    ensure_tools()
    base = load_job(JOB, overrides={"steps": args.steps, "eval_interval": args.eval_interval})
    tflops = calibrate_tflops(base)
    wans = {"fast": Wan(args.fast_mbit, args.fast_latency_ms, MTU["fast"]),
            "slow": Wan(args.fast_mbit / args.slowdown_factor,
                        args.fast_latency_ms * args.slowdown_factor, MTU["slow"])}
    plans = {name: planned(base, tflops, wan, args.steps // args.min_rounds)
             for name, wan in wans.items()}
    log(f"device {tflops * 1e3:.2f} GFLOP/s; plans: "
        + ", ".join(f"{k} {sync_of(p)} ({p.step_time_s:.3f} s/step)" for k, p in plans.items()))
    runs: dict[str, dict] = {}
    with scratch_dir("shoal-wan-") as scratch:
        for name, wan in wans.items():
            job = base.model_copy(update={"sync": SyncSpec(**sync_of(plans[name]))})
            runs[name] = train(job, wan, Path(scratch), name)
            log(f"{name}: {sync_of(plans[name])}, val {runs[name]['report']['val_loss']:.4f}, "
                f"{runs[name]['wall_s']:.1f} s, {runs[name]['bytes_per_worker'] / 1e6:.2f} MB/worker, "
                f"forwarders {runs[name]['forwarder_cpu_s']} CPU s")
        plain_fast = plans["fast"].mode is SyncMode.allreduce and plans["fast"].codec.value == "none"
        if not plain_fast:  # the reference is plain all-reduce on the fast network
            runs["plain"] = train(base, wans["fast"], Path(scratch), "plain")
    plain = runs["fast"] if plain_fast else runs["plain"]
    fast_t, slow_t = time_to(runs["fast"], args.target), time_to(runs["slow"], args.target)
    result = {
        "workers": WORKERS, "steps": args.steps, "target_val_loss": args.target,
        "min_rounds": args.min_rounds,
        "fast": {**wans["fast"].settings(), **sync_of(plans["fast"]), "time_to_target_s": fast_t,
                 "val_loss": _r(runs["fast"]["report"]["val_loss"])},
        "slow": {**wans["slow"].settings(), **sync_of(plans["slow"]), "time_to_target_s": slow_t,
                 "val_loss": _r(runs["slow"]["report"]["val_loss"]),
                 "samples_dropped": runs["slow"]["report"].get("samples_dropped")},
        "slowdown": round(slow_t / fast_t, 3) if fast_t and slow_t else None,
        "bytes_ratio": runs["slow"]["bytes_per_worker"] / plain["bytes_per_worker"],
        "wire_bytes_ratio": runs["slow"]["wire_per_worker"] / plain["wire_per_worker"],
        "loss_gap": _r(runs["slow"]["report"]["val_loss"] - plain["report"]["val_loss"]),
        "device_gflops": round(tflops * 1e3, 3),
        "emulation": ("userspace link emulator (tests/harness/link_emulator.py) on every host's link, "
                      "both ways: the rate, half the one-way latency, a drop-tail queue of queue_ms"),
        "runtime_env": RUNTIME_ENV,
        "forwarder_cpu_s": {name: r["forwarder_cpu_s"] for name, r in runs.items()},
        "curves": {name: [[e["step"], round(e["val_loss"], 3)] for e in r["evals"]]
                   for name, r in runs.items()},
        "load_avg": os.getloadavg()[0],
    }
    result["bytes_ratio"] = float(f"{result['bytes_ratio']:.3g}")
    result["wire_bytes_ratio"] = float(f"{result['wire_bytes_ratio']:.3g}")
    result["targets_met"] = {
        "slowdown": result["slowdown"] is not None and result["slowdown"] <= TARGETS["slowdown_max"],
        "bytes_ratio": result["bytes_ratio"] <= TARGETS["bytes_ratio_max"],
        "loss_gap": result["loss_gap"] <= TARGETS["loss_gap_max"]}
    print(json.dumps(result))
    if args.record:
        append_result("wan", result)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


if __name__ == "__main__":
    main()
