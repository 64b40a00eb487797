"""A GPT-2-style transformer written out in plain PyTorch (no transformers
dependency), used by the tests (small) and the benchmark (GPT-2 124M:
``TinyGPT(vocab=50257, d=768, heads=12, layers=12, seq=1024)``, 124.4M
parameters with the output head tied to the token embedding, as in GPT-2).
Attention is the "eager" formulation (scores, causal mask, softmax, dropout).
"""

from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    """A GPT-2 block: pre-norm causal self-attention and a GELU MLP, with dropout."""

    def __init__(self, d: int, heads: int, seq: int, p: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.heads = heads
        self.drop = nn.Dropout(p)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.drop(self.c_proj(y))
        x = x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))
        return x


class TinyGPT(nn.Module):
    """Token and position embeddings, blocks, final norm, tied output head."""

    @classmethod
    def gpt2_124m(cls, seq: int = 1024, p: float = 0.1) -> "TinyGPT":
        return cls(vocab=50257, d=768, heads=12, layers=12, seq=seq, p=p)

    def __init__(self, vocab: int = 128, d: int = 64, heads: int = 4, layers: int = 2, seq: int = 32, p: float = 0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.drop = nn.Dropout(p)
        self.h = nn.ModuleList(Block(d, heads, seq, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
