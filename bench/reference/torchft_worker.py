"""One torchft replica group (of one process) training the bench GPT.

Per step: the optimizer wrapper's zero_grad starts the quorum (synchronous, so
the participant count and rank are known before the data is chosen, and a
joiner heals from a peer before its first forward), the gradient is all-reduced
as one flat tensor with `manager.allreduce(SUM)`, and the wrapper's step applies
it only if `manager.should_commit()` agrees. Runs until it is killed.

With --wait-for, the process starts as a warm spare: it imports torch and builds
the model, writes <wait-for>.ready, and contacts the lighthouse only once the
harness creates the <wait-for> file.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch.distributed import ReduceOp, TCPStore
from torchft.manager import Manager
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupGloo

from bench.reference.common import StepLine, StepLogWriter
from bench.reference.training import GPTTraining


class FlatGradient:
    """The model's gradients as one buffer, all-reduced in one collective."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.buffer = torch.zeros(sum(p.numel() for p in params))

    def gather(self) -> torch.Tensor:
        torch.cat([p.grad.reshape(-1) for p in self.params], out=self.buffer)
        return self.buffer

    def scatter(self) -> None:
        """Point every .grad at its slice of the (reduced) buffer."""
        offset = 0
        for p in self.params:
            p.grad = self.buffer[offset: offset + p.numel()].view_as(p)
            offset += p.numel()


def wait_as_spare(go: Path) -> None:
    go.with_suffix(".ready").touch()
    while not go.exists():
        time.sleep(0.005)


def build_manager(training: GPTTraining, replica_id: str, lighthouse: str,
                  timeout_s: float, quorum_timeout_s: float, address: str) -> Manager:
    model, optimizer = training.model, training.optimizer

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(state: dict[str, object]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    # The replica group's own store (one process per group); the group's gloo
    # ring across replicas is rebuilt by torchft on every quorum change.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    # `timeout` bounds collectives, should_commit, the heal transfer and joining
    # a new gloo ring; the last one waits it out in full when a member died
    # between quorum and ring, so it is kept short. A quorum may wait for a
    # peer stuck in exactly that, so its own timeout is longer.
    timeout = timedelta(seconds=timeout_s)
    return Manager(
        pg=ProcessGroupGloo(timeout=timeout), load_state_dict=load_state_dict,
        state_dict=state_dict, min_replica_size=1, use_async_quorum=False,
        timeout=timeout, quorum_timeout=timedelta(seconds=quorum_timeout_s),
        connect_timeout=timeout,
        rank=0, world_size=1, store_addr=address, store_port=store.port,
        lighthouse_addr=lighthouse, replica_id=replica_id, hostname=address,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--quorum-timeout-s", type=float, default=60.0)
    parser.add_argument("--wait-for", type=Path)
    parser.add_argument("--address", default="127.0.0.1",
                        help="this host's address, as peers reach it (across namespaced hosts)")
    args = parser.parse_args()

    (args.run_dir / "pids" / args.replica_id).write_text(str(os.getpid()))
    training = GPTTraining.build(args.job, args.corpus, args.threads)
    if args.wait_for is not None:
        wait_as_spare(args.wait_for)
    manager = build_manager(training, args.replica_id, args.lighthouse, args.timeout_s,
                            args.quorum_timeout_s, args.address)
    optimizer = OptimizerWrapper(manager, training.optimizer)
    gradient = FlatGradient(list(training.model.parameters()))
    log = StepLogWriter(args.run_dir / "steps" / f"{args.replica_id}.jsonl")
    batch = training.job.global_batch
    while True:
        t_start = time.time()
        optimizer.zero_grad(set_to_none=True)  # quorum (and healing) happen here
        step, rank, world = manager.current_step(), manager.participating_rank(), manager.num_participants()
        if rank is None:  # not in this step's quorum: contribute zeros
            gradient.buffer.zero_()
        else:
            (training.model.loss_sum(training.share_windows(step, world, rank)) / batch).backward()
            gradient.gather()
        # SUM of per-share losses over the global batch: the global-mean gradient.
        manager.allreduce(gradient.buffer, reduce_op=ReduceOp.SUM).wait()
        gradient.scatter()
        training.prepare_update(step)
        optimizer.step()  # applies only if manager.should_commit()
        if manager.current_step() > step:
            logged_rank = -1 if rank is None else rank  # -1: not in this step's quorum
            log.write(StepLine(step, t_start, time.time(), world, args.replica_id, 0, logged_rank))


if __name__ == "__main__":
    main()
