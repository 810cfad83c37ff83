"""GPT (decoder-only, causal) as an ordered list of layers, nanoGPT style (Karpathy's nanoGPT, GPT-2).

Layers (the profile's layers, in order):

0. :class:`GPTEmbedding` ``ids (b, s) -> (b, s, h)``: token + learned position embedding.
1..L. :class:`~executor.models.blocks.Block` (causal self-attention + GELU MLP, pre-norm).
L+1. :class:`GPTHead` ``(x, targets) -> loss``: final LayerNorm, LM head (weights tied to the token
   embedding when ``config.tied_embeddings``), mean cross-entropy. The loss lives in the last layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from executor.models.blocks import INIT_STD, Block
from executor.models.config import ModelConfig


def init_token_embedding(weight: torch.Tensor, seed: int) -> None:
    """N(0, 0.02) from a generator of its own, so a tied head copy can draw exactly the same values."""
    with torch.no_grad():
        nn.init.normal_(weight, 0.0, INIT_STD, generator=torch.Generator().manual_seed(seed))


class GPTEmbedding(nn.Module):
    """Token plus learned absolute position embedding (GPT-2), then dropout."""

    takes_targets = False

    def __init__(self, config: ModelConfig, token_seed: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab, config.hidden)
        self.pos = nn.Embedding(config.seq, config.hidden)
        self.dropout = config.dropout
        init_token_embedding(self.tok.weight, token_seed)
        nn.init.normal_(self.pos.weight, 0.0, INIT_STD)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return F.dropout(self.tok(ids) + self.pos(positions), self.dropout, self.training)


class GPTHead(nn.Module):
    """Final LayerNorm, LM head without bias, mean cross-entropy over all positions."""

    takes_targets = True

    def __init__(self, config: ModelConfig, token_seed: int) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.weight = nn.Parameter(torch.empty(config.vocab, config.hidden))
        if config.tied_embeddings:
            init_token_embedding(self.weight, token_seed)  # identical copy of the embedding's weight
        else:
            nn.init.normal_(self.weight, 0.0, INIT_STD)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln_f(x), self.weight)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def make_layer(config: ModelConfig, index: int, token_seed: int) -> nn.Module:
    """Layer ``index`` of ``range(config.layers + 2)``."""
    if index == 0:
        return GPTEmbedding(config, token_seed)
    if index <= config.layers:
        return Block(config, causal=True)
    return GPTHead(config, token_seed)


class GPT(nn.Module):
    """The whole model, nanoGPT style: ``GPT(layers)(ids, targets) -> (logits, loss)``.

    Built from the layer list (``executor.models.build_layers``) so the two share weights; used to
    check that running the layers one by one (or as stages) computes the same thing.
    """

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embedding = layers[0]
        self.blocks = nn.ModuleList(layers[1:-1])
        self.head = layers[-1]

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embedding(ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head.logits(x)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss
