"""Training one job on one worker: the plain loop, with exact resume.

Everything that makes it robust lives in the objects it calls (the data
order, the checkpoint store, the progress display); the loop itself reads
top to bottom like nanoGPT's.
"""

from __future__ import annotations

import logging
import shutil
import signal
import time
from collections import deque
from pathlib import Path

import torch

from shoal.proof.layout import ProofLayout
from shoal.spec import JobSpec, Precision, TrainReport
from shoal.train.checkpoint import CheckpointStore, restore_snapshot, take_snapshot
from shoal.models.corpus import Corpus, load_corpus
from shoal.train.errors import CheckpointError
from shoal.train.hashing import param_sha256
from shoal.models.model import GPT
from shoal.models.optim import build_optimizer, lr_at, set_lr
from shoal.models.precision import forward_precision
from shoal.train.order import DataOrder
from shoal.models.progress import TrainProgress

log = logging.getLogger(__name__)


def accumulate_gradients(model: GPT, windows: torch.Tensor, micro_batch: int,
                         batch_size: int, precision: Precision = Precision.fp32) -> float:
    """Backward over `windows` in chunks; gradients are of the mean over `batch_size`."""
    total = 0.0
    for chunk in windows.split(micro_batch):
        with forward_precision(precision):
            loss = model.loss_sum(chunk) / batch_size
        loss.backward()
        total += loss.item()
    return total


@torch.no_grad()
def evaluate(model: GPT, windows: torch.Tensor, micro_batch: int) -> float:
    """Mean next-byte loss (nats/byte) over fixed validation windows."""
    model.eval()
    total = sum(model.loss_sum(chunk).item() for chunk in windows.split(micro_batch))
    model.train()
    return total / len(windows)


class StopRequest:
    """SIGINT/SIGTERM ask the loop to stop at the next step boundary, with a checkpoint."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = {}

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:  # a second signal: the user means it
            raise KeyboardInterrupt
        self.requested = True
        log.warning("stop requested: finishing this step and writing a checkpoint")


def open_checkpoints(job: JobSpec, resume: bool, fresh: bool) -> CheckpointStore:
    directory = Path(job.checkpoint_dir)
    if fresh and directory.exists():
        shutil.rmtree(directory)
    store = CheckpointStore(directory, job.resume_identity(), keep=job.checkpoint.keep)
    latest = store.latest_step()
    if latest is not None and not resume:
        store.close()
        raise CheckpointError(
            f"{directory} already holds checkpoints up to step {latest}; "
            "pass --resume to continue that run or --fresh to start over"
        )
    return store


def open_proof_dir(job: JobSpec, resume: bool, fresh: bool) -> None:
    """Work records follow the checkpoints: --fresh starts them over, a resume appends,
    and a new run never mixes its records with an old run's."""
    directory = Path(job.proof_dir)
    if not job.proof.enabled:
        return
    if fresh and directory.exists():
        shutil.rmtree(directory)
    if not resume and any(ProofLayout(directory).records_dir.glob("*.jsonl")):
        raise CheckpointError(f"{directory} already holds work records of an earlier run; "
                              "pass --resume to continue that run or --fresh to start over")


def train_job(job: JobSpec, *, resume: bool = False, fresh: bool = False,
              show_progress: bool = True, corpus: Corpus | None = None) -> TrainReport:
    started = time.perf_counter()
    context, batch = job.model.context, job.global_batch
    micro_batch = job.micro_batch or batch
    corpus = corpus or load_corpus(job.data, context)
    order = DataOrder(corpus.num_samples(context), job.seed)
    val_windows = torch.from_numpy(corpus.val_windows(job.eval_batches * batch, context))

    torch.manual_seed(job.seed)
    model = GPT(job.model)
    optimizer = build_optimizer(model, job.optimizer)
    log.info("model: %.2fM parameters", model.num_parameters() / 1e6)

    store = open_checkpoints(job, resume, fresh)
    step, cursor = 0, 0
    snapshot = store.load_latest() if resume else None
    if snapshot is not None:
        restore_snapshot(snapshot, model, optimizer)
        step, cursor = snapshot.step, snapshot.cursor
        log.info("resumed from step %d (%s)", step, store.directory)
    elif resume:
        log.info("no checkpoint in %s yet; starting from step 0", store.directory)
    start_step = step

    recent_losses: deque[float] = deque(maxlen=20)
    val_loss, tokens, loop_start = None, 0, time.perf_counter()
    with TrainProgress(job.steps, start_step, show_progress) as progress, StopRequest() as stop:
        while step < job.steps and not stop.requested:
            set_lr(optimizer, lr_at(step, job.steps, job.optimizer.lr, job.schedule))
            sample_ids = order.sample_ids(range(cursor, cursor + batch))
            windows = torch.from_numpy(corpus.windows(sample_ids, context))  # (B, T+1)
            loss = accumulate_gradients(model, windows, micro_batch, batch, job.precision)
            if job.optimizer.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), job.optimizer.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step, cursor = step + 1, cursor + batch

            recent_losses.append(loss)
            tokens += batch * context
            progress.step(step, loss, tokens / (time.perf_counter() - loop_start))
            if step % job.eval_interval == 0 or step == job.steps:
                val_loss = evaluate(model, val_windows, micro_batch)
                progress.evaluated(step, val_loss)
            if step % job.checkpoint.interval_steps == 0 or step == job.steps or stop.requested:
                store.save_async(take_snapshot(step, cursor, model, optimizer))
        loop_s = time.perf_counter() - loop_start
    store.close()
    if stop.requested and step < job.steps:
        log.warning("stopped at step %d of %d; continue with --resume", step, job.steps)

    return TrainReport(
        job=job.name,
        steps=step,
        start_step=start_step,
        train_loss=sum(recent_losses) / len(recent_losses) if recent_losses else None,
        val_loss=val_loss,
        tokens_per_s=tokens / loop_s if loop_s > 0 else 0.0,
        wall_s=time.perf_counter() - started,
        checkpoints=store.written,
        checkpoint_dir=str(store.directory),
        param_sha256=param_sha256(model),
    )
