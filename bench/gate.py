"""What the rendezvous gate costs a job: the step time of the same two-worker job
whose launchers reach its host directly, and through the host's TLS gate.

Each run starts a job host (`shoal rendezvous`, with `--gate-dir` for the gated
one), and two launchers as two hosts would (`shoal train JOB --workers 1
--rendezvous HOST:PORT`, a pass from `shoal rendezvous-pass` in the gated one),
named as a market's leases (`lease:N`, nodes `AGENT-lN-aA`) so that the gate
holds each to the store policy as it holds a market job's,
all on this machine. The runs alternate, direct then gated, `--repeats` times.
A step's time is the gap between consecutive commits in worker 0's step log
(after the first 50 steps); each run gives its median.

Each repeat also runs the gated job for twice the steps: what the gate
relayed in the longer run less the shorter one's, over the steps between, is
the steady state's cost of a step (start and end cancel out).

Prints one JSON line: `direct_step_ms` and `gated_step_ms` (medians over the
runs), `added_ms` (the median over the repeats of the gated run's step less the
direct run's just before it: what the gate's relays, the launcher's tunnel and
the host's gate, add to a step; paired, so that the shared machine's load,
which moves step times by more than the gate costs, falls on both alike),
`added_ms_of_medians` (the medians' difference), the runs' figures, `requests_per_worker_step` (the store requests the gate relayed
per worker and step in the steady state, median over the repeats: every
request a worker and its launcher make), `round_trips_per_worker_step` (those
of them that wait for an answer: all but `SET`, which c10d's client sends and
does not wait on), `requests_by_kind` (the steady state's, by query and key
family, from the median repeat), and the job's steps. The cost per step is
fixed: the tiny model's ~5 ms steps show it at its largest share.

    .venv/bin/python bench/gate.py [--steps 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.history, as a script
from bench.history import RECORD_HELP, append_result  # noqa: E402

SHOAL = [sys.executable, "-m", "shoal.cli.main"]
WORKERS = 2  # one per launcher, each named as a lease of its own
JOB = """name = "gate-bench"
seed = 7
steps = {steps}
global_batch = 8
eval_interval = 100000
eval_batches = 1
[model]
layers = 1
heads = 2
width = 32
context = 32
[data]
max_bytes = 300000
[optimizer]
lr = 0.003
[checkpoint]
dir = "{root}/ckpt"
interval_steps = 100000
"""


def run(root: Path, steps: int, gated: bool) -> tuple[float, dict[str, int] | None]:
    """The median step time (s) of one run, and (gated) the store requests the gate relayed,
    by query and key family."""
    root.mkdir(parents=True)
    job = root / "job.toml"
    job.write_text(JOB.format(steps=steps, root=root))
    host_cmd = SHOAL + ["rendezvous", "--bind", "127.0.0.1", "--port", "0", "--run-dir",
                        # The host waits up to this long for the members to exit: worker
                        # 0 adds its val_loss to the final report after the job is done,
                        # and at 0 the store could close under it (1 run in 8 failed so).
                        str(root / "host"), "--min-workers", str(WORKERS), "--linger-s", "2",
                        "--steps", str(steps)]
    if gated:
        host_cmd += ["--gate-dir", str(root / "gate")]
    host = subprocess.Popen(host_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (root / "host" / "host.json").exists():
        if time.monotonic() > deadline or host.poll() is not None:
            sys.exit("the job host did not start")
        time.sleep(0.1)
    endpoint = json.loads((root / "host" / "host.json").read_text())["endpoint"]
    launchers = []
    for i in range(WORKERS):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
        if gated:
            env["SHOAL_RENDEZVOUS_PASS"] = subprocess.run(
                SHOAL + ["rendezvous-pass", str(root / "gate"), f"lease:{i + 1}"], check=True,
                capture_output=True, text=True).stdout.strip()
        launchers.append(subprocess.Popen(
            SHOAL + ["train", str(job), "--workers", "1", "--rendezvous", endpoint, "--node",
                     f"bench-l{i + 1}-a0", "--run-dir", str(root / f"run{i}")],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if any(launcher.wait() != 0 for launcher in launchers):
        sys.exit(f"a launcher failed; see {root}")
    host.wait()
    commits = sorted(json.loads(line)["t_commit"] for path in (root / "run0").rglob("*.jsonl")
                     for line in path.read_text().splitlines() if '"t_commit"' in line)
    gaps = [b - a for a, b in zip(commits[50:], commits[51:])]
    requests = None
    if gated:  # the host wrote what its gate relayed as it closed
        gate = json.loads((root / "host" / "gate.json").read_text())
        requests = gate["relayed_kinds"]
    return statistics.median(gaps), requests


def per_step(short: dict[str, int], long: dict[str, int], steps: int) -> dict[str, float]:
    """What the `steps` more steps of the longer run cost, per worker and step, by kind."""
    return {kind: (long.get(kind, 0) - short.get(kind, 0)) / (steps * WORKERS)
            for kind in set(short) | set(long)}


def median_run(requests: list[dict[str, float]]) -> dict[str, float]:
    """The repeat whose total is the median's (the middle one of an odd count)."""
    ordered = sorted(requests, key=lambda r: sum(r.values()))
    return ordered[(len(ordered) - 1) // 2]


def answered(requests: dict[str, float]) -> float:
    """The requests that wait for the store's answer (a `SET` does not)."""
    return sum(n for kind, n in requests.items() if not kind.startswith("SET "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"direct": [], "gated": []}
    requests: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="shoal-gate-bench-") as tmp:
        for repeat in range(args.repeats):
            for gated in (False, True):
                name = "gated" if gated else "direct"
                step_s, relayed = run(Path(tmp) / f"{repeat}-{name}", args.steps, gated)
                runs[name].append(step_s)
                if relayed is not None:
                    _, longer = run(Path(tmp) / f"{repeat}-long", 2 * args.steps, gated)
                    requests.append(per_step(relayed, longer, args.steps))
    direct, gated = (statistics.median(runs[k]) * 1e3 for k in ("direct", "gated"))
    paired = statistics.median(g - d for d, g in zip(runs["direct"], runs["gated"])) * 1e3
    result = {"direct_step_ms": round(direct, 2), "gated_step_ms": round(gated, 2),
              "added_ms": round(paired, 2), "added_ms_of_medians": round(gated - direct, 2),
              "requests_per_worker_step": round(statistics.median(
                  sum(r.values()) for r in requests), 2),
              "round_trips_per_worker_step": round(statistics.median(
                  answered(r) for r in requests), 2),
              # The same by query and key family ("WAIT decision"), from the median repeat.
              "requests_by_kind": {k: round(v, 2) for k, v in sorted(
                  median_run(requests).items(), key=lambda kv: -kv[1]) if v >= 0.01},
              "runs_ms": {k: [round(v * 1e3, 2) for v in vs] for k, vs in runs.items()},
              "steps": args.steps, "workers": WORKERS}
    print(json.dumps(result))
    if args.record:
        append_result("gate", result)


if __name__ == "__main__":
    main()
