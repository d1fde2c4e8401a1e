"""The built-in GPT as an elastic worker program: what `shoal train JOB.toml
--workers N` launches in each process. It is also the reference example of
the API: a plain loop around `run.batches`, `run.backward` and
`optimizer.step()`.
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import torch

import shoal
from shoal.spec import JobSpec, hyper_digest, load_job
from shoal.verify.work_records import ProofSettings
from shoal.models.corpus import Corpus, load_corpus
from shoal.models.model import GPT
from shoal.models.optim import build_optimizer, lr_at, set_lr
from shoal.models.precision import forward_precision
from shoal.models.single import evaluate


class CorpusWindows:
    """The corpus as a dataset of training windows (context+1 bytes each)."""

    def __init__(self, corpus: Corpus, context: int) -> None:
        self.corpus, self.context = corpus, context

    def num_samples(self) -> int:
        return self.corpus.num_samples(self.context)

    def get_batch(self, ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.corpus.windows(ids, self.context))  # (B, T+1)


def proof_settings(job: JobSpec) -> ProofSettings:
    """What the job's work records bind (shared with the verifier's replay)."""
    return ProofSettings(job=job.name, spec=job.proof, directory=job.proof_dir,
                         hyper_sha256=hyper_digest(job.hyperparameters()), seed=job.seed,
                         micro_batch=job.micro_batch)


def main(argv: list[str]) -> None:
    # `--job-json JSON` (how the launcher passes a job with CLI overrides applied) or a job file.
    job = JobSpec.model_validate_json(argv[1]) if argv[0] == "--job-json" else load_job(argv[0])
    run = shoal.join(proof=proof_settings(job) if job.proof.enabled else None)
    corpus = load_corpus(job.data, job.model.context)
    torch.manual_seed(job.seed)
    model = GPT(job.model)
    model, optimizer = run.wrap(model, build_optimizer(model, job.optimizer),
                                grad_clip=job.optimizer.grad_clip, aggregation=job.aggregation,
                                sync=job.sync)

    for batch in run.batches(CorpusWindows(corpus, job.model.context), job.global_batch,
                             job.steps, seed=job.seed, micro_batch=job.micro_batch):
        set_lr(optimizer, lr_at(run.step_index, job.steps, job.optimizer.lr, job.schedule))
        with forward_precision(job.precision):
            loss = model.loss_sum(batch) / len(batch)  # mean over this micro-batch
        run.backward(loss)  # loss.backward(), and the loss reaches the guard
        optimizer.step()

    if run.is_reporter:
        val = torch.from_numpy(corpus.val_windows(job.eval_batches * job.global_batch,
                                                  job.model.context))
        run.publish_final(val_loss=evaluate(model, val, job.micro_batch or job.global_batch))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(sys.argv[1:])
