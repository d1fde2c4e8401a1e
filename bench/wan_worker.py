"""The built-in GPT worker with validation along the way, for bench/wan.py: rank 0
evaluates what every replica agrees on (every-step sync: any step; DiLoCo:
theta_outer, right after an outer step) once every `eval_interval` steps and appends {step, val_loss, t, eval_s} to
RUN_DIR/evals.jsonl. Everyone else waits for it at the next exchange, so the
bench subtracts eval_s from the time to the target loss."""

from __future__ import annotations

import json
import logging
import sys
import time

import torch

import shoal
from shoal.models.corpus import load_corpus
from shoal.models.gpt_worker import CorpusWindows
from shoal.models.model import GPT
from shoal.models.optim import build_optimizer, lr_at, set_lr
from shoal.models.precision import forward_precision
from shoal.models.single import evaluate
from shoal.spec import JobSpec


def main(argv: list[str]) -> None:
    job = JobSpec.model_validate_json(argv[1])
    run = shoal.join()
    corpus = load_corpus(job.data, job.model.context)
    torch.manual_seed(job.seed)
    model = GPT(job.model)
    model, optimizer = run.wrap(model, build_optimizer(model, job.optimizer),
                                grad_clip=job.optimizer.grad_clip, sync=job.sync)
    val = torch.from_numpy(corpus.val_windows(job.eval_batches * job.global_batch, job.model.context))
    evals = open(run.config.run_dir / "evals.jsonl", "a", buffering=1)
    next_eval = job.eval_interval
    for batch in run.batches(CorpusWindows(corpus, job.model.context), job.global_batch,
                             job.steps, seed=job.seed, micro_batch=job.micro_batch):
        set_lr(optimizer, lr_at(run.step_index, job.steps, job.optimizer.lr, job.schedule))
        with forward_precision(job.precision):
            loss = model.loss_sum(batch) / len(batch)
        run.backward(loss)
        optimizer.step()
        # Right after a voted step (every step, or DiLoCo's outer step), theta_outer as
        # every replica holds it (with slt, the model also holds this worker's own rounds
        # in flight).
        if run.step_index >= next_eval and run.sync.votes(run.step_index - 1) and run.rank == 0:
            t0 = time.time()
            with run.sync.agreed():
                loss_now = evaluate(model, val, job.micro_batch or job.global_batch)
            evals.write(json.dumps({"step": run.step_index, "val_loss": loss_now, "t": t0,
                                    "eval_s": time.time() - t0}) + "\n")
            next_eval = run.step_index + job.eval_interval
    if run.is_reporter:
        run.publish_final(val_loss=evaluate(model, val, job.micro_batch or job.global_batch))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(sys.argv[1:])
