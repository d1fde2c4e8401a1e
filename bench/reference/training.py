"""The bench GPT's training step as every reference runs it: the same model,
seed, optimizer, data order and loss scaling as shoal, so that only the
runtime around the step differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shoal.spec import JobSpec
from shoal.spec.jobfile import load_job
from shoal.models.corpus import Corpus, load_corpus
from shoal.models.model import GPT
from shoal.models.optim import build_optimizer, lr_at, set_lr
from shoal.train.order import DataOrder, share_positions, split_shares


def cache_corpus(job: JobSpec, directory: Path) -> Path:
    """Load the job's corpus once and save its training bytes for the workers to map.

    Workers (and every torchrun restart) then start without walking the corpus.
    """
    corpus = load_corpus(job.data, job.model.context)
    path = directory / "train-bytes.npy"
    np.save(path, corpus.train)
    return path


def cached_corpus(path: Path) -> Corpus:
    train = np.load(path, mmap_mode="r")
    return Corpus(train=train, val=np.empty(0, dtype=np.uint8), files=0, source=str(path))


@dataclass
class GPTTraining:
    """Model, optimizer and data order of one worker of the bench job."""

    job: JobSpec
    corpus: Corpus
    order: DataOrder
    model: GPT
    optimizer: torch.optim.Optimizer

    @classmethod
    def build(cls, job_path: str, corpus_path: Path, threads: int) -> GPTTraining:
        torch.set_num_threads(threads)
        job = load_job(job_path)
        corpus = cached_corpus(corpus_path)
        torch.manual_seed(job.seed)  # the same initial weights in every worker
        model = GPT(job.model)
        optimizer = build_optimizer(model, job.optimizer)
        return cls(job, corpus, DataOrder(corpus.num_samples(job.model.context), job.seed),
                   model, optimizer)

    def share_windows(self, step: int, world: int, rank: int) -> torch.Tensor:
        """(share, T+1) windows of `rank`'s share of `step`, the global batch split evenly."""
        batch = self.job.global_batch
        shares = split_shares(batch, world)
        positions = share_positions(step * batch, shares, rank)
        ids = self.order.sample_ids(positions)
        return torch.from_numpy(self.corpus.windows(ids, self.job.model.context))

    def prepare_update(self, step: int) -> None:
        """Clip the (already averaged) gradients and set the step's learning rate."""
        if self.job.optimizer.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.job.optimizer.grad_clip)
        set_lr(self.optimizer, lr_at(step, self.job.steps, self.job.optimizer.lr, self.job.schedule))


def check_workers(job_path: str, workers: int) -> JobSpec:
    job = load_job(job_path)
    if not 1 <= workers <= job.global_batch:
        raise ValueError(f"workers must be between 1 and the global batch ({job.global_batch})")
    return job
