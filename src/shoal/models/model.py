"""A small GPT over bytes: token and position embeddings, pre-norm blocks,
causal self-attention, a tied output head. The nanoGPT shape, kept small
enough to train on two CPU cores.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from shoal.spec import BYTE_VOCAB, ModelSpec


class CausalSelfAttention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.heads = spec.heads
        self.dropout = spec.dropout
        self.qkv = nn.Linear(spec.width, 3 * spec.width)
        self.proj = nn.Linear(spec.width, spec.width)
        self.resid_drop = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(spec.width)
        self.attn = CausalSelfAttention(spec)
        self.ln2 = nn.LayerNorm(spec.width)
        self.mlp = nn.Sequential(
            nn.Linear(spec.width, 4 * spec.width),
            nn.GELU(),
            nn.Linear(4 * spec.width, spec.width),
            nn.Dropout(spec.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.token_emb = nn.Embedding(BYTE_VOCAB, spec.width)
        self.pos_emb = nn.Embedding(spec.context, spec.width)
        self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.width)
        self.head = nn.Linear(spec.width, BYTE_VOCAB, bias=False)
        self.head.weight = self.token_emb.weight  # weight tying
        self.apply(self._init_weights)
        # Scaled init of residual projections (GPT-2): keeps the residual
        # stream's variance from growing with depth.
        for name, param in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * spec.layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, 256) for byte ids `idx` (B, T)."""
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.token_emb(idx) + self.pos_emb(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss_sum(self, windows: torch.Tensor) -> torch.Tensor:
        """Summed next-byte cross-entropy (nats) over windows (B, T+1), averaged over T.

        A sum over samples (not a mean) so that gradient accumulation over
        any split of a batch adds up to the same total.
        """
        inputs, targets = windows[:, :-1], windows[:, 1:]
        logits = self(inputs)
        per_token = F.cross_entropy(
            logits.reshape(-1, BYTE_VOCAB), targets.reshape(-1), reduction="none"
        )
        return per_token.view(targets.shape).mean(dim=1).sum()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
