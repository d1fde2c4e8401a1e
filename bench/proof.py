"""Proof of learning (issue 10): is every adversary caught, is nobody honest
accused, and what does verification cost against the training it checks?

Runs real elastic jobs of a small byte-level GPT with proof enabled
(`shoal train --workers N`, work records on disk): one all-honest job of 4
workers, and two jobs of 6 workers where workers 1-5 each run a different
built-in adversary (every one of `shoal.verify.adversary.BUILT_IN`) and w0
stays honest. Each complete proof epoch of each job is then audited the
way a verifier would: a sample at the job's `audit_rate` with at least
`min_audits_per_worker` audits per worker, chosen by a salted beacon.

Prints one JSON line:
- `detection`: per adversary, the share of epochs in which it was caught,
  among the epochs it had records in (`absent_epochs`: the others; a worker
  fenced on a loaded machine may sit one out; `missed_verdicts`: what its
  audits said in an epoch it got away);
- `false_positives`: guilty verdicts on honest workers, over the sampled
  audits and a full audit of every record of the honest job
  (`honest_audits` says how many);
- `audit_rate`: audits over records in the sampled audits;
- `overhead`: verification compute over training compute, the median of
  `--repeats` pairs timed in turns (`overhead_runs`; each pair's audit a fresh
  sample). Both are timed
  here, in one process on the same threads: the sampled audits of the honest
  job (all their checks, parameter loads included) over re-executing every
  record of it (every worker's forward and backward of every step, which is
  what training computed, less its optimizer steps and exchanges: a smaller
  denominator, so the figure errs high). PoL's top-Q replay re-runs a
  constant fraction of all updates whatever the job; `pol_overhead` is that
  reference when it replays one update in `--pol-every`;
- `sent_check_cost`: what binding each worker's exchanged part to its record
  costs the workers (their sketches at every voted step) over the same
  training compute: a cost of recording work, not of verifying it.
Targets: every adversary caught in >= 99% of epochs at `overhead` <= 0.05, zero
false positives. `--overhead-only` runs the honest job alone (no detection
figures): to see what the overhead does at another epoch length or batch.

`unrecorded` (poisons its part and files no record) is judged from what its
peers' records say it declared, which needs the run's published membership
(its `epochs.jsonl`), as a verifier has it.

`--sync diloco` runs the same under DiLoCo (`--inner-steps` per round), with
the adversary that poisons only pseudo-gradients (`outer_scale`) added
(`unrecorded` there poisons its pseudo-gradients and files no record: each
of its rounds is replayed from the states it kept); its
training compute is every record's forward, backward and optimizer step,
timed from each worker's kept start states.

    .venv/bin/python bench/proof.py [--steps 300] [--epoch-steps 50] [--sync diloco]
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

import torch

from shoal.coordinator.proofs.published_epochs import PublishedEpochs
from shoal.verify.roles.verifier import Verifier
from shoal.models.gpt_replay import gpt_replayer
from shoal.proof.epochs import epoch_of
from shoal.proof.verdicts import guilty_workers
from shoal.spec import hyper_digest, load_job
from shoal.verify import sketch
from shoal.verify.adversary import BUILT_IN, DILOCO_ONLY, EVERY_STEP_ONLY
from shoal.verify.audit.record import Auditor
from shoal.verify.proof_store import ProofStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.history, as a script
from bench.history import RECORD_HELP, append_result  # noqa: E402

JOB = """name = "proof-bench"
seed = 11
steps = {steps}
global_batch = {batch}
eval_interval = 1000
eval_batches = 1
[model]
layers = 2
heads = 2
width = 64
context = 64
[data]
max_bytes = 2000000
[optimizer]
lr = 0.003
[schedule]
warmup_steps = 10
[checkpoint]
dir = "{dir}/ckpt"
interval_steps = 100000
[proof]
enabled = true
epoch_steps = {epoch_steps}
keep_epochs = 1000
dir = "{dir}/proof"
{sync}"""


def run_job(root: Path, workers: int, adversaries: dict[int, str], args) -> tuple[Path, float]:
    root.mkdir(parents=True)
    path = root / "job.toml"
    sync = (f'[sync]\nmode = "diloco"\ninner_steps = {args.inner_steps}\n'
            if args.sync == "diloco" else "")
    path.write_text(JOB.format(steps=args.steps, batch=args.global_batch, dir=root,
                               epoch_steps=args.epoch_steps, sync=sync))
    flags = [f"--adversary={i}={name}" for i, name in adversaries.items()]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shoal.cli.main", "train", str(path),
                           "--workers", str(workers), "--run-dir", str(root / "run"), *flags],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        sys.exit(f"job failed: {done.stderr[-2000:]}")
    return path, time.perf_counter() - started


def audit(path: Path, every: bool) -> tuple[list, int, float]:
    """Verdicts of every complete epoch, records seen, and seconds spent auditing."""
    job = load_job(path)
    auditor = Auditor(ProofStore(job.proof_dir), gpt_replayer(job),
                      hyper_sha256=hyper_digest(job.hyperparameters()), tolerance=job.proof.tolerance)
    published = PublishedEpochs(lambda _: path.parent / "run")  # names record-less shares
    verifier = Verifier(auditor, job.proof, salt=os.urandom(16), total_steps=job.steps,
                        members=lambda epoch: published.members("", epoch))
    if auditor.replayer.inner is not None:  # its first build imports torch's compiler: once
        auditor.replayer.fresh_optimizer_state()
    records = auditor.store.records()
    verdicts, seen, seconds = [], 0, 0.0
    for epoch in verifier.complete_epochs(records):
        mine = [r for r in records if epoch_of(r.step, job.proof.epoch_steps) == epoch]
        result = verifier.audit_epoch(epoch, mine, every=every)
        verdicts.append(result.verdicts)
        seen += len(mine)
        seconds += result.replay_s
    return verdicts, seen, seconds


def training_compute(path: Path) -> float:
    """Seconds of what training computed for every record of a job: each worker's
    forward and backward of each step, and under DiLoCo its own optimizer step, from
    the state the step started from (loads not timed)."""
    job = load_job(path)
    store = ProofStore(job.proof_dir)
    replayer = gpt_replayer(job)
    seconds = 0.0
    for record in store.records():
        if record.local is not None:
            params, state = store.load_local(record.worker, record.step)
        else:
            params, state = store.load_params(record.step), None
        replayer.load(params)
        started = time.perf_counter()
        gradients = replayer.contribution(record)
        if state is not None and record.local.applied:
            replayer.local_step(record, params, state, gradients)
        seconds += time.perf_counter() - started
    return seconds


def sent_check_compute(path: Path) -> float:
    """Seconds a job's workers spent sketching for the sent check (shoal.verify.sent_check):
    at every voted step, each worker sketches its own part and the exchanged sum, here
    timed on each voted record's revealed contribution (twice, as the worker does)."""
    job = load_job(path)
    store = ProofStore(job.proof_dir)
    seconds = 0.0
    for record in store.records():
        if record.exchanged is None:
            continue
        part = store.load_reveal(record.worker, record.step)
        part = part[-1:] if record.local is not None else part  # DiLoCo: the pseudo-gradient
        started = time.perf_counter()
        sketch.sketch(record.exchanged.seed, part, part)
        seconds += time.perf_counter() - started
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--epoch-steps", type=int, default=50)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--sync", choices=("allreduce", "diloco"), default="allreduce")
    parser.add_argument("--inner-steps", type=int, default=5, help="DiLoCo: steps per round")
    parser.add_argument("--repeats", type=int, default=3,
                        help="times the honest job's audit and training compute are timed")
    parser.add_argument("--pol-every", type=int, default=10,
                        help="PoL reference: one replayed update in this many")
    parser.add_argument("--overhead-only", action="store_true",
                        help="run the honest job alone: overhead and false positives, no "
                             "adversaries (detection is then empty)")
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the same threads as each worker: a like-for-like cost
    left_out = EVERY_STEP_ONLY if args.sync == "diloco" else DILOCO_ONLY
    cheats = sorted(n for n in BUILT_IN if n not in left_out)
    half = (len(cheats) + 1) // 2
    groups = [cheats[:half], cheats[half:]]
    detection: dict[str, float | None] = {}
    absent: dict[str, int] = {}  # adversary -> epochs it had no records in
    missed: dict[str, list[str]] = {}  # adversary -> its verdicts in an epoch it was not caught
    false_positives, honest_audits, audits, records = 0, 0, 0, 0
    with tempfile.TemporaryDirectory(prefix="shoal-proof-bench-") as tmp:
        honest_path, _ = run_job(Path(tmp) / "honest", 4, {}, args)
        # Verification and training compute timed in turns, `--repeats` times, each
        # audit a fresh sample (a new salt): the overhead is the median of the pairs'
        # ratios, so a burst of load on this shared machine skews one pair, not the
        # figure.
        pairs, sampled = [], []
        for _ in range(args.repeats):
            epochs, seen, audit_s = audit(honest_path, every=False)
            pairs.append((audit_s, training_compute(honest_path)))
            sampled += epochs
        audit_s, full_s = statistics.median(a for a, _ in pairs), \
            statistics.median(t for _, t in pairs)
        overhead = statistics.median(a / t for a, t in pairs)
        full, _, _ = audit(honest_path, every=True)
        sent_s = sent_check_compute(honest_path)
        for epoch in sampled + full:
            false_positives += len(guilty_workers(epoch))
            honest_audits += len(epoch)
        audits += sum(len(e) for e in epochs)  # one sample's
        records += seen
        for i, group in enumerate(groups if not args.overhead_only else []):
            path, _ = run_job(Path(tmp) / f"cheats{i}", len(group) + 1,
                              {k + 1: name for k, name in enumerate(group)}, args)
            epochs, seen, _ = audit(path, every=False)
            audits += sum(len(e) for e in epochs)
            records += seen
            for k, name in enumerate(group):
                # The epochs it had records in (a worker fenced on a loaded machine may
                # sit one out), and in those, what its audits found where it got away.
                present = [e for e in epochs if any(v.worker == f"w{k + 1}" for v in e)]
                caught = sum(1 for e in present if f"w{k + 1}" in guilty_workers(e))
                detection[name] = round(caught / len(present), 4) if present else None
                if len(present) < len(epochs):
                    absent[name] = len(epochs) - len(present)
                for e in present:
                    if f"w{k + 1}" not in guilty_workers(e):
                        missed[name] = sorted({v.kind.value for v in e if v.worker == f"w{k + 1}"})
            for e in epochs:
                honest = [v for v in e if v.worker == "w0"]
                honest_audits += len(honest)
                false_positives += sum(1 for v in honest if v.guilty)
    result = {
        "detection": detection, "absent_epochs": absent, "missed_verdicts": missed,
        "false_positives": false_positives,
        "honest_audits": honest_audits, "audit_rate": round(audits / records, 4),
        "overhead": round(overhead, 4), "pol_overhead": round(1 / args.pol_every, 4),
        "overhead_runs": [round(a / t, 4) for a, t in pairs],
        "audit_s": round(audit_s, 3), "training_compute_s": round(full_s, 3),
        # What the sent check costs the workers (not verification): its sketches over
        # the same training compute.
        "sent_check_cost": round(sent_s / full_s, 4), "sent_check_s": round(sent_s, 3),
        "steps": args.steps, "epoch_steps": args.epoch_steps, "global_batch": args.global_batch,
        "sync": args.sync, **({"inner_steps": args.inner_steps} if args.sync == "diloco" else {}),
        "targets": {"detection": ">= 0.99 each", "overhead": "<= 0.05", "false_positives": 0},
    }
    print(json.dumps(result))
    if args.record:
        append_result("proof", result)


if __name__ == "__main__":
    main()
