"""Worker program: a bfloat16 model trained with a plain `loss.backward()`,
as a third-party script ported to `shoal run` would be written."""

import sys

import torch

import shoal

steps = int(sys.argv[1])
generator = torch.Generator().manual_seed(0)
inputs = torch.randn(4000, 8, generator=generator)
targets = inputs @ torch.randn(8, 1, generator=generator)
data = torch.utils.data.TensorDataset(inputs.bfloat16(), targets.bfloat16())
run = shoal.join()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).bfloat16()
model, optimizer = run.wrap(model, torch.optim.SGD(model.parameters(), lr=0.05))
for x, y in run.batches(data, global_batch=32, steps=steps, micro_batch=8):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
if run.is_reporter:
    with torch.no_grad():
        run.publish_final(mse=float(torch.nn.functional.mse_loss(model(inputs[:500].bfloat16()).float(),
                                                                  targets[:500])))
