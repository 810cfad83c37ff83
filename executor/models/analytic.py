"""Closed-form parameter counts and saved-activation sizes of the zoo's layers (our implementation).

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(MLSys'23, section 4.1), whose transformer layer stores ``sbh (34 + 5 a s / h)`` bytes in fp16 with
dropout. Our block (:class:`executor.models.blocks.Block`) has no dropout masks (dropout 0) and the
softmax output is saved once (for ``att @ v``; softmax's own backward reuses it). Per sample, in
elements of the activation dtype (``s`` sequence, ``h`` hidden, ``a`` heads, ffn ``4h``):

=======================================  ===========
LayerNorm 1 input (the block input)      ``s h``
QKV linear input (LN 1 output)           ``s h``
``q @ k^T``: copies of q and k            ``2 s h``
softmax output (saved once)              ``a s^2``
``att @ v``: copy of v                    ``s h``
output projection input                  ``s h``
LayerNorm 2 input                        ``s h``
MLP fc input (LN 2 output)               ``s h``
GELU input                               ``4 s h``
MLP proj input (GELU output)             ``4 s h``
=======================================  ===========

i.e. ``16 s h + a s^2`` elements (Korthikanti's ``34 s h + 5 a s^2`` bytes less the dropout masks
``2 s h + a s^2`` bytes and the second softmax copy ``2 a s^2`` bytes, at 2 bytes/element), plus the
LayerNorm statistics (mean and rstd, fp32: ``2 * 2 * s * 4`` bytes). Constant per-micro-batch tensors (the
inverted causal mask) are not per sample.
"""

from __future__ import annotations

from executor.models.config import ModelConfig

LN_STAT_BYTES = 4  # LayerNorm saves mean and rstd in fp32


def block_params(c: ModelConfig, i: int = 0) -> int:
    """Block ``i`` (0-based), :meth:`planner.model.ModelSpec.block_params` (GPT/BERT: ``4h^2 + 2 h f + 9h + f``; a
    mixture of experts' dense layers hold the dense MLP)."""
    return c.block_params(i)


def embedding_params(c: ModelConfig) -> int:
    """Token (and learned position) tables, plus the embedding LayerNorm for BERT."""
    return c.embedding_params() + (2 * c.hidden if c.family == "bert" else 0)


def head_params(c: ModelConfig) -> int:
    """Final norm + the (tied copy of the) vocabulary projection; BERT adds transform and bias."""
    n = c.head_params()
    if c.family == "bert":
        n += c.hidden * c.hidden + c.hidden + 2 * c.hidden + c.vocab
    return n


def layer_params(c: ModelConfig) -> list[int]:
    """Per layer of ``build_layers``; a tied head counts its copy of the embedding."""
    return [embedding_params(c), *(block_params(c, i) for i in range(c.layers)), head_params(c)]


def model_params(c: ModelConfig) -> int:
    """Parameters of the whole model, tied weights once."""
    return sum(layer_params(c)) - (c.vocab * c.hidden if c.tied_embeddings else 0)


def block_saved_bytes_per_sample(c: ModelConfig, bytes_per_element: int = 4) -> int:
    """Bytes one block saves for backward per sample (table above)."""
    s, h, a = c.seq, c.hidden, c.heads
    assert c.ffn_hidden == 4 * h, "the table assumes ffn_hidden = 4 hidden"
    return bytes_per_element * (16 * s * h + a * s * s) + 2 * 2 * s * LN_STAT_BYTES


def gpt_head_saved_bytes_per_sample(c: ModelConfig, bytes_per_element: int = 4) -> int:
    """GPT head: LN input and output (``2 s h``), log-softmax output (``s V``), LN stats, int64 targets."""
    s, h, v = c.seq, c.hidden, c.vocab
    return bytes_per_element * (2 * s * h + s * v) + 2 * s * LN_STAT_BYTES + 8 * s
