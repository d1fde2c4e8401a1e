"""The built-in GPT's replay: how a verifier re-executes a recorded step of a
`shoal train` job (the same loss and batches as `shoal.models.gpt_worker`)."""

from __future__ import annotations

import torch

from shoal.models.corpus import load_corpus
from shoal.models.gpt_worker import CorpusWindows
from shoal.models.model import GPT
from shoal.models.optim import build_optimizer, lr_at
from shoal.models.precision import forward_precision
from shoal.spec import JobSpec
from shoal.spec.plan import SyncMode
from shoal.verify.replay import InnerOptimizer, JobSeeds, Replayer


def gpt_replayer(job: JobSpec) -> Replayer:
    corpus = load_corpus(job.data, job.model.context)
    windows = CorpusWindows(corpus, job.model.context)

    def loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        with forward_precision(job.precision):
            return model.loss_sum(batch) / len(batch)  # as the worker's loop computes it

    inner = None
    if job.sync.mode is SyncMode.diloco:  # each worker's own AdamW/SGD steps, as the job sets them
        inner = InnerOptimizer(
            build=lambda model: build_optimizer(model, job.optimizer),
            lr=lambda step: lr_at(step, job.steps, job.optimizer.lr, job.schedule),
            grad_clip=job.optimizer.grad_clip)
    return Replayer(GPT(job.model), loss, windows.get_batch, windows.num_samples(), inner,
                    JobSeeds(job.seed, job.micro_batch))
