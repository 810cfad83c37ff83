"""Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1, eq. 9-19), as transformers'
``DeepseekV3Attention`` (and ``DeepseekV2Attention``) computes it, for the Llama-family block of
:mod:`executor.models.llama` when the spec has ``kv_lora_rank`` (:attr:`planner.model.ModelSpec.mla`).

Symbols: ``h`` hidden, ``a`` heads, ``d`` each head's query/key width (``head_dim`` = ``qk_nope_head_dim +
qk_rope_head_dim``), ``r`` its rotated part (``qk_rope_head_dim``), ``n = d - r`` the part from the latent
(``qk_nope_head_dim``), ``v`` each head's value width (``v_head_dim``), ``c`` the key/value latent (``kv_lora_rank``),
``c'`` the query latent (``q_lora_rank``, or none). The modules (transformers' names; no biases):

* queries: ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` (``h -> c'``, an RMSNorm of ``c'``, ``c' -> a d``), or
  ``q_proj(x)`` (``h -> a d``) without a query latent (DeepSeek-V2-Lite); each head's ``d`` split into ``n`` and
  ``r`` (``q_nope``, ``q_rot``);
* keys and values: ``kv_a_proj_with_mqa(x)`` (``h -> c + r``) split into the latent (``c``) and one rotated key
  ``k_rot`` (``r``) shared by every head; the latent through ``kv_a_layernorm`` (RMSNorm of ``c``) and
  ``kv_b_proj`` (``c -> a (n + v)``): each head's ``k_nope`` (``n``) and value (``v``);
* rotary positions on ``q_rot`` and ``k_rot`` only, DeepSeek's interleaved form: the pairs ``(x_{2i}, x_{2i+1})``
  rotated by ``m theta^(-2i/r)`` (transformers' V3 ``apply_rotary_pos_emb_interleave``, its default
  ``rope_interleave``: the rotated pairs laid out evens then odds; V2's ``apply_rotary_emb`` rotates the same
  pairs as complex numbers and lays them out in pairs: a permutation of the same ``r`` dimensions, applied to the
  query and the key alike, so the same scores);
* each head's query ``[q_nope, q_rot]`` against its key ``[k_nope, k_rot]``, scaled by ``1/sqrt(d)``, causal
  softmax (:func:`executor.models.llama.causal_attention`: Gemma 2's soft-cap and a sliding window where the spec
  has them), times the values: ``a v`` wide, then ``o_proj`` (``a v -> h``).

The latents' RMSNorms have transformers' (and DeepSeek's) fixed epsilon ``1e-6`` (``DeepseekV3RMSNorm``'s default,
not ``rms_norm_eps``, which the block's other norms take as the spec's ``norm_eps``). Not applied: yarn's rescaled
angles and its ``mscale`` of the softmax scale (DeepSeek-V2/V3's ``rope_scaling``): they change numbers, not shapes or
cost, as Llama 3.1's ``rope_scaling`` (not applied either).

Tensor parallelism (:class:`executor.tensor_parallel.TensorParallelLatentAttention`) splits it by heads as
Megatron-Core's ``MLASelfAttention``: the down projections and the latents' norms replicated, ``q_b_proj`` /
``q_proj`` and ``kv_b_proj`` column-parallel, ``o_proj`` row-parallel.
"""

from __future__ import annotations

import torch
from torch import nn

from executor.models.blocks import init_linear
from executor.models.config import ModelConfig

#: the latents' RMSNorm epsilon (transformers' DeepseekV3RMSNorm / DeepseekV2RMSNorm default, as DeepSeek's code)
LATENT_NORM_EPS = 1e-6


def rotary_cos_sin_pairs(seq: int, rope_dim: int, theta: float, device: torch.device,
                         dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of the angles ``m theta^(-2i/r)``, positions ``m < seq``, pairs ``i < r/2``:
    ``(seq, r/2)``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float64, device=device) / rope_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64, device=device), inv_freq)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs ``(x_{2i}, x_{2i+1})`` of ``x (..., s, r)`` by the angles of ``cos, sin (s, r/2)``; the
    result laid out evens then odds (transformers' ``apply_rotary_pos_emb_interleave``)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class LatentAttention(nn.Module):
    """Multi-head latent attention of one block (module docstring); ``forward(x (b, s, h)) -> (b, s, h)``, the
    output projection included."""

    def __init__(self, config: ModelConfig, residual_std: float, theta: float, cap: float | None = None,
                 window: int | None = None) -> None:
        super().__init__()
        h, a, d = config.hidden, config.heads, config.d
        r, c, v = int(config.qk_rope_head_dim), int(config.kv_lora_rank), config.v_d  # type: ignore[arg-type]
        self.heads, self.head_dim, self.rope_dim, self.v_dim = a, d, r, v
        self.theta, self.cap, self.window = theta, cap, window
        qr = config.q_lora_rank
        self.q_a_proj = nn.Linear(h, qr, bias=False) if qr is not None else None
        self.q_a_layernorm = nn.RMSNorm(qr, eps=LATENT_NORM_EPS) if qr is not None else None
        self.q_b_proj = nn.Linear(qr, a * d, bias=False) if qr is not None else None
        self.q_proj = nn.Linear(h, a * d, bias=False) if qr is None else None
        self.kv_a_proj_with_mqa = nn.Linear(h, c + r, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(c, eps=LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(c, a * (d - r + v), bias=False)
        self.o_proj = nn.Linear(a * v, h, bias=False)
        for lin in (self.q_a_proj, self.q_b_proj, self.q_proj, self.kv_a_proj_with_mqa, self.kv_b_proj):
            if lin is not None:
                init_linear(lin)
        init_linear(self.o_proj, residual_std)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, s, a d)``: through the query latent, or projected directly."""
        if self.q_proj is not None:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def compressed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The normed key/value latent ``(b, s, c)`` and the shared key ``k_rot (b, s, r)``, not yet rotated."""
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_a_layernorm.normalized_shape[0], self.rope_dim],
                                                          dim=-1)
        return self.kv_a_layernorm(latent), k_rot

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latent, k_rot = self.compressed(x)
        return self.o_proj(latent_attention(self.queries(x), self.kv_b_proj(latent), k_rot, self.head_dim,
                                            self.rope_dim, self.v_dim, self.theta, self.cap, self.window))


def latent_attention(q: torch.Tensor, kv: torch.Tensor, k_rot: torch.Tensor, head_dim: int, rope_dim: int,
                     v_dim: int, theta: float, cap: float | None = None, window: int | None = None) -> torch.Tensor:
    """The attention of the heads of ``q (b, s, a' d)`` (``a'``: every head, or a tensor rank's) over their keys and
    values ``kv (b, s, a' (n + v))`` (``kv_b_proj``'s output) and the shared ``k_rot (b, s, r)``, not yet rotated
    (module docstring). Returns ``(b, s, a' v)``, the output projection's input."""
    from executor.models.llama import causal_attention

    b, s, _ = q.shape
    d, r, v = head_dim, rope_dim, v_dim
    n = d - r
    q = q.view(b, s, -1, d).transpose(1, 2)  # (b, a', s, d)
    heads = q.shape[1]
    q_nope, q_rot = q.split([n, r], dim=-1)
    k_nope, value = kv.view(b, s, heads, n + v).transpose(1, 2).split([n, v], dim=-1)
    cos, sin = rotary_cos_sin_pairs(s, r, theta, q.device, q.dtype)
    q_rot = apply_rotary_interleaved(q_rot, cos, sin)
    k_rot = apply_rotary_interleaved(k_rot.view(b, 1, s, r), cos, sin).expand(b, heads, s, r)
    query = torch.cat([q_nope, q_rot], dim=-1)
    key = torch.cat([k_nope, k_rot], dim=-1)
    return causal_attention(query, key, value, cap, window)
