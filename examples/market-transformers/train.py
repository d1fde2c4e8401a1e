"""A Hugging Face transformers GPT-2 trained as its users write the loop: AdamW,
`get_linear_schedule_with_warmup` on the optimizer, gradient clipping, and a
tokenized corpus read where it lies (token shards at any fsspec URL: s3://, gs://,
https://, a path). The model is built from a small config and randomly
initialised: nothing is downloaded but packages.

Under `shoal run` on machines one controls, or on the market as it is:

    shoal run train.py --workers 2 -- --data 's3://corpus/tokens/train-*.bin'
    shoal submit train.py -r requirements.txt --steps 200 --global-batch 16 \
        --workers 3 --max-price ... --budget ... -- --data 's3://corpus/tokens/train-*.bin'
"""

import argparse

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

import shoal
from shoal.train.token_shards import TokenShards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="URL of the token shards (a glob).")
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="Samples per forward pass (gradients accumulate over the rest).")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast forward.")
    args = parser.parse_args()

    train, held_out = TokenShards(args.data, args.context).split(32)

    run = shoal.join()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50257, n_positions=args.context, n_embd=64, n_layer=2,
                        n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model, optimizer = run.wrap(model, optimizer, grad_clip=1.0)
    # As the transformers docs write it, on the optimizer in hand; given to the run, which
    # steps it once per step on every worker and hands its state to whoever joins.
    scheduler = run.schedule(get_linear_schedule_with_warmup(optimizer, args.warmup, args.steps))

    model.train()
    for x, y in run.batches(train, global_batch=args.global_batch, steps=args.steps,
                            micro_batch=args.micro_batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

    if run.is_reporter:
        model.eval()
        with torch.no_grad():
            x, y = held_out.get_batch(np.arange(32))
            val = torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1),
                                                    y.flatten())
        run.publish_final(val_loss=float(val), lr=scheduler.get_last_lr()[0])


if __name__ == "__main__":
    main()
