"""Transformer building blocks shared by the GPT and BERT layers (nanoGPT style, pre-norm).

Attention is written out (``q @ k^T``, softmax, ``@ v``) rather than calling
``scaled_dot_product_attention``: it is readable, and what autograd saves for backward is the same on
every backend, so :mod:`executor.models.analytic` can count it (the fused kernels save other things).

Initialisation follows GPT-2 / nanoGPT: weights N(0, 0.02), biases 0, the residual projections
N(0, 0.02 / sqrt(2 L)) (Radford et al. 2019, section 2.3).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from executor.models.config import ModelConfig

INIT_STD = 0.02


def init_linear(linear: nn.Linear, std: float = INIT_STD) -> None:
    """N(0, std) weights, zero bias."""
    nn.init.normal_(linear.weight, mean=0.0, std=std)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


class SelfAttention(nn.Module):
    """Multi-head self-attention; ``causal`` masks future positions (GPT), otherwise bidirectional (BERT)."""

    def __init__(self, config: ModelConfig, causal: bool) -> None:
        super().__init__()
        self.heads = config.heads
        self.causal = causal
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)
        self.dropout = config.dropout
        init_linear(self.qkv)
        init_linear(self.proj, INIT_STD / math.sqrt(2 * config.layers))
        mask = torch.ones(config.seq, config.seq, dtype=torch.bool).tril()
        self.register_buffer("mask", mask.view(1, 1, config.seq, config.seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=2)
        # (b, s, h) -> (b, heads, s, head_dim)
        q = q.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        k = k.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        v = v.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h // self.heads))
        if self.causal:
            att = att.masked_fill(~self.mask[:, :, :s, :s], float("-inf"))
        att = F.softmax(att, dim=-1)
        att = F.dropout(att, self.dropout, self.training)
        y = (att @ v).transpose(1, 2).contiguous().view(b, s, h)
        return F.dropout(self.proj(y), self.dropout, self.training)


class MLP(nn.Module):
    """Linear(h, ffn) -> GELU -> Linear(ffn, h)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.hidden, config.ffn_hidden)
        self.proj = nn.Linear(config.ffn_hidden, config.hidden)
        self.dropout = config.dropout
        init_linear(self.fc)
        init_linear(self.proj, INIT_STD / math.sqrt(2 * config.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.proj(F.gelu(self.fc(x))), self.dropout, self.training)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))`` (GPT-2 layout).

    BERT uses the same block without the causal mask (pre-LN instead of BERT's post-LN, as in
    Xiong et al. 2020; the cost and memory are the same).
    """

    takes_targets = False

    def __init__(self, config: ModelConfig, causal: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.attn = SelfAttention(config, causal)
        self.ln2 = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
