"""Worker program for the DiLoCo inner-step test: a linear model under DiLoCo
(H given), which records the steps at which it voted and all-reduced, and
writes them to RUN_DIR/calls-WORKER.json at the end."""

import json
import sys

import torch

import shoal
from shoal.spec.job import SyncSpec
from shoal.train.group import EpochGroup
from shoal.train.rendezvous import Rendezvous

steps, inner_steps = int(sys.argv[1]), int(sys.argv[2])
calls: dict[str, list[int]] = {"votes": [], "all_reduces": []}
vote, all_reduce = Rendezvous.vote, EpochGroup.all_reduce


def counted_vote(self, epoch, index, worker, ballot):
    calls["votes"].append(ballot.step)
    return vote(self, epoch, index, worker, ballot)


def counted_all_reduce(self, *args, **kwargs):
    calls["all_reduces"].append(run.step_index)
    return all_reduce(self, *args, **kwargs)


Rendezvous.vote, EpochGroup.all_reduce = counted_vote, counted_all_reduce
data = torch.utils.data.TensorDataset(torch.randn(4000, 4), torch.randn(4000, 1))
run = shoal.join()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
model, optimizer = run.wrap(model, torch.optim.SGD(model.parameters(), lr=0.01),
                            sync=SyncSpec(mode="diloco", inner_steps=inner_steps))
# 20 samples a worker: a 4-sample loss is noisy enough to trip the guard's spike check
for x, y in run.batches(data, global_batch=60, steps=steps):
    run.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
(run.config.run_dir / f"calls-{run.worker}.json").write_text(json.dumps(calls))
