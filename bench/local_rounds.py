"""How much local rounds cost in quality, without a network (issue 11): the tiny
GPT's job (examples/tiny-gpt.toml) trained in one process, once with every-step
averaged gradients (what every-step all-reduce computes: one optimizer on the
global batch) and once per DiLoCo setting with `--workers` replicas stepping
their own shares, averaged every H steps through the runtime's own outer step
(shoal.train.sync.diloco.outer_sgd_step) and codec (shoal.train.sync.codecs).

It answers what bench/wan.py cannot afford to try one emulated run at a time:
how the final validation loss moves with H, the outer optimizer and the codec.
The planner's ladder (shoal.plan.sync) and SparseLoCo's outer defaults
(SyncSpec) cite its figures. Same data order (shoal.train.order.DataOrder),
schedule and clipping as the runtime; no guard, no faults.

    .venv/bin/python -m bench.local_rounds [--steps 300] [--runs "10:none:1:0" ...]

A run is H:CODEC:OUTER_LR:OUTER_MOMENTUM ("none", "int8", "sparseloco"). Prints
progress to stderr and one JSON object: each run's final validation loss and its
gap to every-step averaging, and the bytes each worker would send over every-step
all-reduce's (ring model, 4-byte gradients).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch
from torch.nn.utils import parameters_to_vector

from shoal.models.corpus import load_corpus
from shoal.models.gpt_worker import CorpusWindows
from shoal.models.model import GPT
from shoal.models.optim import build_optimizer, lr_at, set_lr
from shoal.models.single import evaluate
from shoal.spec import load_job
from shoal.spec.job import SyncSpec
from shoal.spec.plan import SyncMode
from shoal.train.sync.codecs import make_codec
from shoal.train.sync.codecs.base import ring_all_gather_bytes, ring_all_reduce_bytes
from shoal.train.sync.diloco import outer_sgd_step
from shoal.train.order import DataOrder

from bench.history import RECORD_HELP, append_result

JOB = "examples/tiny-gpt.toml"
DEFAULT_RUNS = ("10:none:0.7:0.9", "10:none:1:0", "20:none:1:0", "10:sparseloco:1:0")


def log(message: str) -> None:
    print(f"[bench.local_rounds] {message}", file=sys.stderr, flush=True)


def flat(model: torch.nn.Module) -> torch.Tensor:
    """The parameters in DiLoCo's order, as one new vector."""
    return parameters_to_vector(model.parameters()).detach()  # a new tensor (torch.cat)


def load_flat(model: torch.nn.Module, values: torch.Tensor) -> None:
    """Copies `values` into the parameters (torch's vector_to_parameters would make them
    views of it: every replica would then share theta_outer's storage)."""
    at = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(values[at:at + p.numel()].view_as(p))
            at += p.numel()


def step(model, optimizer, batch, lr: float, clip: float) -> None:
    set_lr(optimizer, lr)
    (model.loss_sum(batch) / len(batch)).backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def every_step(job, data, order, val) -> float:
    torch.manual_seed(job.seed)
    model = GPT(job.model)
    optimizer = build_optimizer(model, job.optimizer)
    for s in range(job.steps):
        ids = order.sample_ids(range(s * job.global_batch, (s + 1) * job.global_batch))
        step(model, optimizer, data.get_batch(ids),
             lr_at(s, job.steps, job.optimizer.lr, job.schedule), job.optimizer.grad_clip)
    return evaluate(model, val, job.global_batch)


def local_rounds(job, data, order, val, workers: int, sync: SyncSpec) -> tuple[float, int]:
    """Final validation loss of theta_outer, and the bytes one worker sent."""
    torch.manual_seed(job.seed)
    base = GPT(job.model)
    replicas = [copy.deepcopy(base) for _ in range(workers)]
    optimizers = [build_optimizer(m, job.optimizer) for m in replicas]
    outer = flat(base)
    momentum = torch.zeros_like(outer)
    codecs = [make_codec(sync, [p.shape for p in base.parameters()]) for _ in range(workers)]
    share, sent = job.global_batch // workers, 0
    for s in range(job.steps):
        lr = lr_at(s, job.steps, job.optimizer.lr, job.schedule)
        for w, (model, optimizer) in enumerate(zip(replicas, optimizers)):
            first = s * job.global_batch + w * share
            step(model, optimizer, data.get_batch(order.sample_ids(range(first, first + share))),
                 lr, job.optimizer.grad_clip)
        if (s + 1) % sync.inner_steps and s + 1 < job.steps:
            continue
        deltas = [(outer - flat(m)) / workers for m in replicas]  # equal shares: weight 1/n
        if codecs[0] is None:
            total = torch.stack(deltas).sum(dim=0)
            sent += ring_all_reduce_bytes(total.nbytes, workers)
        else:
            messages = []
            for codec, delta in zip(codecs, deltas):
                messages.append(codec.start(delta))
                codec.commit()
            sent += ring_all_gather_bytes(sum(m.nbytes for m in messages[0]), workers)
            gathered = [[m[i] for m in messages] for i in range(len(messages[0]))]
            total = codecs[0].finish(gathered)
        outer_sgd_step(outer, momentum, total, sync)
        for model in replicas:
            load_flat(model, outer)
    load_flat(base, outer)
    return evaluate(base, val, job.global_batch), sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", nargs="*", default=list(DEFAULT_RUNS))
    parser.add_argument("--record", action="store_true", help=RECORD_HELP)
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = load_job(JOB, overrides={"steps": args.steps})
    corpus = load_corpus(job.data, job.model.context)
    data = CorpusWindows(corpus, job.model.context)
    order = DataOrder(data.num_samples(), job.seed)
    val = torch.from_numpy(corpus.val_windows(job.eval_batches * job.global_batch,
                                              job.model.context))
    started = time.perf_counter()
    plain = every_step(job, data, order, val)
    params = sum(p.numel() for p in GPT(job.model).parameters())
    plain_bytes = ring_all_reduce_bytes(4 * params, args.workers) * job.steps
    log(f"every step: {plain:.4f} ({time.perf_counter() - started:.0f} s)")
    results = []
    for run in args.runs:
        h, codec, lr, mu = run.split(":")
        sync = SyncSpec(mode=SyncMode.diloco, inner_steps=int(h), codec=codec,
                        outer_lr=float(lr), outer_momentum=float(mu))
        started = time.perf_counter()
        loss, sent = local_rounds(job, data, order, val, args.workers, sync)
        results.append({"inner_steps": int(h), "codec": codec, "outer_lr": float(lr),
                        "outer_momentum": float(mu), "val_loss": round(loss, 4),
                        "gap": round(loss - plain, 4),
                        "bytes_ratio": float(f"{sent / plain_bytes:.3g}")})
        log(f"{run}: {loss:.4f} (gap {loss - plain:+.4f}, bytes 1/{plain_bytes / sent:.0f}, "
            f"{time.perf_counter() - started:.0f} s)")
    result = {"job": JOB, "steps": args.steps, "workers": args.workers,
              "global_batch": job.global_batch, "every_step_val_loss": round(plain, 4),
              "runs": results}
    print(json.dumps(result))
    if args.record:
        append_result("local_rounds", result)


if __name__ == "__main__":
    main()
