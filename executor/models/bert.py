"""BERT-style encoder (bidirectional attention, masked-LM head) with the same layer interface as GPT.

Layers: 0. :class:`BertEmbedding` (token + position embedding, LayerNorm; no token types: single-segment
pre-training), 1..L. bidirectional pre-norm blocks, L+1. :class:`BertMLMHead` ``(x, targets) -> loss``:
final LayerNorm, transform (dense + GELU + LayerNorm, Devlin et al. 2019 / the BERT reference code),
decoder tied to the token embedding plus a bias, mean cross-entropy over positions whose target is not
``-100`` (the unmasked positions; see :func:`executor.models.data.synthetic_batch`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from executor.models.blocks import INIT_STD, Block, init_linear
from executor.models.config import ModelConfig
from executor.models.gpt import init_token_embedding

IGNORE_INDEX = -100


class BertEmbedding(nn.Module):
    """Token plus position embedding, LayerNorm, dropout."""

    takes_targets = False

    def __init__(self, config: ModelConfig, token_seed: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab, config.hidden)
        self.pos = nn.Embedding(config.seq, config.hidden)
        self.ln = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.dropout = config.dropout
        init_token_embedding(self.tok.weight, token_seed)
        nn.init.normal_(self.pos.weight, 0.0, INIT_STD)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return F.dropout(self.ln(self.tok(ids) + self.pos(positions)), self.dropout, self.training)


class BertMLMHead(nn.Module):
    """Masked-LM head with the loss; ``targets`` is ``-100`` where no prediction is asked."""

    takes_targets = True

    def __init__(self, config: ModelConfig, token_seed: int) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.dense = nn.Linear(config.hidden, config.hidden)
        self.ln_t = nn.LayerNorm(config.hidden, eps=config.norm_eps)
        self.weight = nn.Parameter(torch.empty(config.vocab, config.hidden))
        self.bias = nn.Parameter(torch.zeros(config.vocab))
        init_linear(self.dense)
        if config.tied_embeddings:
            init_token_embedding(self.weight, token_seed)
        else:
            nn.init.normal_(self.weight, 0.0, INIT_STD)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_t(F.gelu(self.dense(self.ln_f(x))))
        return F.linear(h, self.weight, self.bias)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(x)
        return F.cross_entropy(
            logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
        )


def make_layer(config: ModelConfig, index: int, token_seed: int) -> nn.Module:
    """Layer ``index`` of ``range(config.layers + 2)``."""
    if index == 0:
        return BertEmbedding(config, token_seed)
    if index <= config.layers:
        return Block(config, causal=False)
    return BertMLMHead(config, token_seed)
