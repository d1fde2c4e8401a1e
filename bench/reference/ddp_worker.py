"""One rank of plain static DDP over gloo, as torchrun launches it: the worker of
both the static-DDP throughput baseline and the torchrun fault reference.

With --checkpoint-dir, rank 0 saves a checkpoint every job.checkpoint.interval_steps
(in the background, as shoal's single-worker trainer does) and every rank resumes
from the newest one when torchrun restarts the group.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bench.reference.common import StepLine, StepLogWriter, free_port
from bench.reference.training import GPTTraining
from shoal.train.checkpoint import CheckpointStore, restore_snapshot, take_snapshot


class LossSum(torch.nn.Module):
    """GPT.loss_sum as a forward, so that DDP's reducer sees the pass that makes the gradients."""

    def __init__(self, training: GPTTraining) -> None:
        super().__init__()
        self.gpt = training.model

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        return self.gpt.loss_sum(windows)


def torchrun_command(job_path: str, corpus: Path, run_dir: Path, workers: int, steps: int,
                     threads: int, max_restarts: int = 0,
                     checkpoint_dir: Path | None = None) -> list[str]:
    """torchrun on one node with c10d rendezvous, running this module `workers` times.

    --nnodes=1 (not 1:N): with a fixed node count the rendezvous closes as soon as
    the one agent arrives, with no last-call wait, which is torchrun's fastest
    restart (NOTES: 7.7 s against 9.7 s for 1:4 with last_call_timeout=1).
    """
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", f"--nproc-per-node={workers}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id={run_dir.name}", f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1",
        "-m", "bench.reference.ddp_worker",
        "--job", str(Path(job_path).resolve()), "--corpus", str(corpus),
        "--run-dir", str(run_dir), "--steps", str(steps), "--threads", str(threads),
    ]
    if checkpoint_dir is not None:
        command += ["--checkpoint-dir", str(checkpoint_dir)]
    return command


def init_group(rank: int, world: int, attempt: int) -> None:
    # torchrun's agent store outlives a restart and still holds the previous
    # attempt's gloo addresses; a fresh prefix per attempt keeps them apart.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                            rank=rank, world_size=world, timeout=timedelta(seconds=60))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint-dir", type=Path)
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    (args.run_dir / "pids" / f"rank{rank}").write_text(str(os.getpid()))
    training = GPTTraining.build(args.job, args.corpus, args.threads)
    job = training.job
    init_group(rank, world, attempt)

    step, checkpoints = 0, None
    if args.checkpoint_dir is not None:
        checkpoints = CheckpointStore(args.checkpoint_dir, job.resume_identity(),
                                      keep=job.checkpoint.keep)
        snapshot = checkpoints.load_latest()
        if snapshot is not None:
            restore_snapshot(snapshot, training.model, training.optimizer)
            step = snapshot.step
    ddp = DistributedDataParallel(LossSum(training))
    log = StepLogWriter(args.run_dir / "steps" / f"rank{rank}-attempt{attempt}.jsonl")
    try:
        while step < args.steps:
            t_start = time.time()
            windows = training.share_windows(step, world, rank)
            # DDP averages over ranks; scaling by the world makes the result the
            # gradient of the global mean loss.
            (ddp(windows) * (world / job.global_batch)).backward()
            training.prepare_update(step)
            training.optimizer.step()
            training.optimizer.zero_grad(set_to_none=True)
            step += 1
            log.write(StepLine(step - 1, t_start, time.time(), world, f"rank{rank}", attempt, rank))
            if checkpoints is not None and rank == 0 and step % job.checkpoint.interval_steps == 0:
                checkpoints.save_async(take_snapshot(step, step * job.global_batch,
                                                     training.model, training.optimizer))
    finally:
        log.close()
        if checkpoints is not None:
            checkpoints.close()
    # Drop DDP (its reducer holds the group) before the group: the other order
    # hung ranks at exit.
    del ddp
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
