"""The projections of multi-head latent attention (:attr:`planner.model.ModelSpec.kv_lora_rank`), for
:func:`planner.operators.layer_operators`: what a transformer layer runs in place of its Q, K, V projections.

DeepSeek-AI 2024, "DeepSeek-V2", section 2.1 (eq. 9-19); transformers' ``DeepseekV3Attention``; Megatron-Core's
``MLASelfAttention``. Symbols as in :mod:`planner.operators`: ``T = b s`` tokens, ``h`` hidden, ``t`` tensor-parallel
size, ``el`` bytes per element; ``a_t = a / t`` heads on the rank, ``d`` each head's query/key width
(``head_dim``), ``r`` its rotated part (``qk_rope_head_dim``), ``v`` its value width (``v_head_dim``), ``c`` the
key/value latent (``kv_lora_rank``), ``c'`` the query latent (``q_lora_rank``):

1. **queries**: with ``c'``, the down-projection ``(T, c', h)``, an RMSNorm over ``c'`` and the up-projection
   ``(T, a_t d, c')``; without it one ``(T, a_t d, h)`` GEMM;
2. **keys and values**: the down-projection ``(T, c + r, h)`` -- the latent and the rotated key every head shares --,
   an RMSNorm over ``c`` and the up-projection ``(T, a_t (d - r + v), c)`` to each head's unrotated key and value;
3. **rotary** on the queries' ``r`` dimensions and the shared key's (the rest of each head is not rotated).

Tensor parallelism (Megatron-Core's ``MLASelfAttention``: ``linear_q_down_proj`` and ``linear_kv_down_proj``
duplicated on every rank, ``linear_q_up_proj`` / ``linear_q_proj`` and ``linear_kv_up_proj`` column-parallel by
heads, ``linear_proj`` row-parallel): the down-projections and their norms run whole on every tensor rank; the
up-projections split by heads. With sequence parallelism the down-projections and latent norms run on the rank's own
``T/t`` rows ("q_compressed: [s / TP, b, q_lora_rank]") and the latents are then all-gathered
(:meth:`planner.cost.ConfigCosts._tp_comm`), each up-projection stashing its input's ``T/t`` shard and gathering it
again in the backward, as the column-parallel GEMMs do the hidden states (Korthikanti et al. 2022, section 4.2.2);
without a query latent the query projection reads the gathered hidden states. The attention core then runs on queries
and keys of width ``d`` and values of width ``v`` (:func:`planner.operators.layer_operators`), and the output
projection reads ``a_t v`` columns.

Kernels: fused (Megatron-Core / Transformer Engine: one kernel per latent norm and for the rotary), or with
``eager`` PyTorch's separate ops (:func:`planner.operators.eager_rms_norm`, :func:`planner.operators.eager_rope`) and
autograd's sum of the two gradients of the input both down-projections read, as for the layer's other norms, rotary
and Q/K/V projections (the copies that put each head's key together from its two parts are not counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from planner.model import ModelSpec
from planner.operators import Operator, eager_grad_sum, eager_rms_norm, eager_rope, elementwise, gemm


def mla_operators(spec: ModelSpec, T: int, a_t: int, el: int, accumulate: bool,
                  gathered: Callable[[Operator], Operator], eager: bool = False,
                  rows: float | None = None) -> list[Operator]:
    """The projections, latent norms and rotary of one layer's latent attention on a tensor rank holding ``a_t``
    heads (module docstring); ``gathered``: the sequence-parallel stash of a GEMM whose input is the gathered
    norm output (:func:`planner.operators.layer_operators`'s); ``eager``: PyTorch's separate element-wise ops;
    ``rows``: the rank's own rows with sequence parallelism (``T/t``; default ``T``: none)."""
    h, d = spec.hidden, spec.d
    r, c, v = int(spec.qk_rope_head_dim or 0), int(spec.kv_lora_rank or 0), spec.v_d
    own = T if rows is None else rows
    m = int(math.ceil(own))  # the down-projections' rows

    def latent_norm(name: str, width: int) -> Operator:
        if eager:
            return eager_rms_norm(name, own, width, el)
        # an RMSNorm over the latent (fused: reads x, writes y; backward reads dy and x; saves its input)
        return elementwise(name, own * width, el, reads=1, writes=1, flops_per=5.0, bwd_reads=2, bwd_writes=1,
                           saved_bytes=el * own * width)

    def up(name: str, n: int, width: int) -> Operator:
        # reads the (gathered) latent of ``width``: stashes the rank's shard of it
        return replace(gemm(name, T, n, width, el, accumulate=accumulate), saved_bytes=el * own * width)

    ops: list[Operator] = []
    if spec.q_lora_rank is not None:
        cq = spec.q_lora_rank
        ops += [gemm("q_down", m, cq, h, el, accumulate=accumulate), latent_norm("q_norm", cq),
                up("q_up", a_t * d, cq)]
    else:
        ops.append(gathered(gemm("q_proj", T, a_t * d, h, el, accumulate=accumulate)))
    # the key/value down-projection reads the same norm output as the queries' first GEMM: saved once
    ops += [gemm("kv_down", m, c + r, h, el, accumulate=accumulate, save_input=False), latent_norm("kv_norm", c),
            up("kv_up", a_t * (d - r + v), c)]
    if eager:  # autograd's sum of the two gradients of the input both first GEMMs read
        ops.append(eager_grad_sum("mla_grad_sum", own * h, el, 1))
    # rotary on the queries' r dimensions and the shared rotated key (read and written; saves nothing)
    ops.append(eager_rope("rope", (T * a_t * r, T * r), el) if eager else
               elementwise("rope", T * (a_t + 1) * r, el, reads=1, writes=1, flops_per=3.0, bwd_reads=1,
                           bwd_writes=1, saved_bytes=0.0))
    return ops
