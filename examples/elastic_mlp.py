"""Any PyTorch loop made elastic with shoal: a small MLP learning a fixed
random function. Run it on 3 workers and kill one mid-way:

    shoal run examples/elastic_mlp.py --workers 3 --chaos kill:1@step100 -- --steps 300
"""

import argparse

import torch

import shoal


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--global-batch", type=int, default=64)
    args = parser.parse_args()

    # The data: 20,000 points of a fixed random function (the same in every process).
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(20_000, 16, generator=generator)
    targets = torch.sin(inputs @ torch.randn(16, 1, generator=generator))
    dataset = torch.utils.data.TensorDataset(inputs, targets)

    run = shoal.join()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model, optimizer = run.wrap(model, torch.optim.Adam(model.parameters(), lr=1e-2))

    for x, y in run.batches(dataset, global_batch=args.global_batch, steps=args.steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        run.backward(loss)
        optimizer.step()

    if run.is_reporter:
        with torch.no_grad():
            run.publish_final(mse=float(torch.nn.functional.mse_loss(model(inputs), targets)))


if __name__ == "__main__":
    main()
