"""A small next-token model trained on a tokenized corpus read where it lies: any
fsspec URL (s3://, gs://, https://, a path), in shards of uint16 token ids, each
worker reading only its own samples of each step. For an S3 bucket, the lease's
AWS_* environment (AWS_ENDPOINT_URL for a store other than AWS) reaches it:

    shoal run examples/token_lm.py --workers 2 -- --data 's3://corpus/tokens/train-*.bin'
"""

import argparse

import numpy as np
import torch

import shoal
from shoal.train.token_shards import TokenShards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="URL of the token shards (a glob).")
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()

    train, held_out = TokenShards(args.data, args.context).split(32)

    run = shoal.join()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(args.vocab, 64), torch.nn.Linear(64, args.vocab))
    model, optimizer = run.wrap(model, torch.optim.AdamW(model.parameters(), lr=3e-3))

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

    for x, y in run.batches(train, global_batch=args.global_batch, steps=args.steps):
        run.backward(loss_of(x, y))
        optimizer.step()

    if run.is_reporter:
        with torch.no_grad():
            run.publish_final(val_loss=float(loss_of(*held_out.get_batch(np.arange(32)))))


if __name__ == "__main__":
    main()
