"""Worker program for the `linear` batch policy test: 8 samples per worker."""

import sys

import torch

import shoal
from shoal.spec.elastic import BatchPolicy

steps = int(sys.argv[1])
data = torch.utils.data.TensorDataset(torch.randn(4000, 4), torch.randn(4000, 1))
run = shoal.join()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
model, optimizer = run.wrap(model, torch.optim.SGD(model.parameters(), lr=0.01))
for x, y in run.batches(data, global_batch=16, steps=steps, policy=BatchPolicy.linear):
    run.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
