"""Llama-family decoders (Llama 2/3/4, Mistral, Qwen2, Qwen3) built from a :class:`~planner.model.ModelSpec`, as an
ordered list of layers with the zoo's interface (:mod:`executor.models.stage`).

Layers:

0. :class:`LlamaEmbedding` ``ids (b, s) -> (b, s, h)``: token embedding only (positions are rotary, inside
   attention).
1..L. :class:`LlamaBlock`: pre-norm (RMSNorm, Zhang & Sennrich 2019, or LayerNorm as the spec says) attention with
   rotary positions (Su et al., RoFormer, 2021, eq. 34, in the "rotate half" layout of the Hugging Face Llama
   code) and grouped-query attention (Ainslie et al. 2023: ``k`` key/value heads, each shared by ``a/k`` query
   heads), then a pre-norm gated MLP ``down(act(gate(x)) * up(x))`` (SwiGLU, Shazeer 2020) or ``down(act(up(x)))``.
   With ``qk_norm`` (Qwen3) each head's query and key go through an RMSNorm of width ``d`` (one weight for all
   heads) before the rotary, as Qwen3's modeling code does (``q_norm``/``k_norm``).
   The rotary angles are computed in every block from the positions ``0..s-1``, so a pipeline stage needs
   nothing but the hidden states from its predecessor. Partial rotary (``rotary_dim``, ``ModelSpec.rot_d``:
   GLM-4.5's 64 of 128, Phi-4-mini's 96 of 128): only each head's first ``r`` query and key dimensions are rotated,
   rotate-half over those ``r`` with the angles ``m theta^(-2i/r)``, the other ``d - r`` passing through, as
   transformers' ``apply_rotary_pos_emb`` (Phi-3's and GLM-4.5's: ``q[..., :rotary_dim]`` rotated, ``q[...,
   rotary_dim:]`` concatenated after it; the table sized ``int(head_dim * partial_rotary_factor)``).
   With ``experts`` (a mixture of experts: Mixtral, Jiang et al. 2024, "Mixtral of Experts", section 2.1;
   Qwen3 MoE; Qwen2 MoE) the MLP of each layer ``ModelSpec.moe_layer`` names is a :class:`SparseMoE` (below), that
   of each of the ``dense_layers`` the dense MLP of width ``ffn_hidden``.
L+1. :class:`LlamaHead` ``(x, targets) -> loss``: final norm, LM head (untied unless the spec ties it to the
   token embedding), mean cross-entropy.

Gemma and Gemma 2 (Gemma Team 2024; :class:`~planner.model.ModelSpec`'s ``embedding_scale``, ``sandwich_norm``,
``attention_softcap``, ``logit_softcap``): the token embeddings times ``sqrt(h)``; a norm on the attention's and
the MLP's output before each residual add; ``cap tanh(x / cap)`` on the scores before the softmax and on the
logits before the loss. Gemma's RMSNorm scales by ``1 + w`` with ``w`` initialised at zero, the same function as
``w`` at one here; Gemma 2's ``query_pre_attn_scalar`` (the scores' scale) is ``1/sqrt(d)`` here (its
published models set it to ``d``, but for 27B's 144): the same shapes and costs, other numbers. A sliding window
(Mistral; Gemma 2's every other layer, Gemma 3's five of six: ``ModelSpec.local_layer``) masks the scores outside
it; Gemma 3's local layers rotate with their own base (``rope_local_theta``).

Mixture of experts (:class:`SparseMoE`; Mixtral of Experts, section 2.1: ``y = sum_{i < E}
Softmax(Top2(x W_g))_i SwiGLU_i(x)``; Qwen3's modeling code, transformers' ``Qwen3MoeSparseMoeBlock``): a router
``nn.Linear(h, E)`` without bias, the softmax of its logits over the ``E`` experts in float32, the ``k``
(``experts_per_token``) largest kept, renormalised to sum to one when ``normalize_topk`` (Mixtral: always; Qwen3
MoE: ``norm_topk_prob``), cast back to the hidden dtype; each token's output is the sum over its ``k`` experts of
weight times ``expert(x)``, each expert an MLP of width ``f_e`` of the dense MLP's form (:class:`Expert`). The
softmax before the top-k equals Mixtral's paper's top-k before the softmax once renormalised; it is what
transformers' ``MixtralTopKRouter`` and ``Qwen3MoeTopKRouter`` compute.

Shared experts and dense layers (Qwen2 MoE as transformers' ``Qwen2MoeSparseMoeBlock`` and ``Qwen2MoeDecoderLayer``
compute them; DeepSeekMoE's shared experts, Dai et al. 2024, section 3.2): with ``shared_expert_ffn_hidden`` every
token also runs through a shared expert, an :class:`Expert` of that width (``SparseMoE.shared_expert``), whose
output is added to the routed experts' sum, scaled first by ``sigmoid(x w)`` with ``shared_expert_gate``
(``SparseMoE.shared_expert_gate``, ``nn.Linear(h, 1)`` without bias; :func:`shared_output`):
``out = routed(x) + sigmoid(x w) shared(x)``. The layers in ``dense_layers`` (Qwen2/Qwen3 MoE's
``mlp_only_layers``; its ``decoder_sparse_step`` is such a list too: the layers ``i`` with ``(i + 1) % step != 0``;
DeepSeek-V3's first three) get the dense MLP of width ``ffn_hidden`` instead of a :class:`SparseMoE`.

DeepSeek's routing (DeepSeek-V2 and -V3, section 2.1.2; transformers' ``DeepseekV2TopkRouter`` and
``DeepseekV3TopkRouter``; :func:`route`, :class:`Router`): ``router_score`` sigmoid scores each expert alone (V3)
instead of the softmax over them; with ``router_groups`` / ``router_group_topk`` each token chooses within its best
groups of consecutive experts (a group's score its best expert's with softmax scores, V2's
``group_limited_greedy``; the sum of its best two with sigmoid scores, V3's ``noaux_tc``); ``router_bias`` adds a
per-expert bias (a buffer, ``Router.expert_bias``, zeros) to the scores for the choice only, the weights being the
scores; the chosen weights are renormalised with ``normalize_topk`` (V3 adds ``1e-20`` to the sum) and multiplied by
``routed_scaling``. DeepSeek's shared experts are one :class:`Expert` of ``n_shared_experts`` times the experts' width
without a gate (``shared_expert_ffn_hidden``), its first ``first_k_dense_replace`` layers the ``dense_layers``.

gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", section 2.1; transformers' ``GptOssAttention``,
``GptOssExperts``, ``GptOssTopKRouter``; ModelSpec's ``attention_sinks``, ``glu_linear_offset``, ``glu_clamp``,
``activation="quick_gelu"``): each block's attention has a learned sink logit per query head (``LlamaBlock.sinks``)
in every softmax's denominator, attending to no value (:func:`causal_attention`); a gated MLP (each expert, the dense
MLP and a shared expert alike) computes ``down(act(min(gate, c)) * (clamp(up, -c, c) + offset))`` (:func:`glu`;
gpt-oss: ``c`` 7, offset 1, ``act`` ``quick_gelu``, ``x sigmoid(1.702 x)``); with ``bias`` every linear layer has
one, the router's too (:class:`Router`); the router's softmax over all ``E`` then renormalised over the chosen
``k`` (``normalize_topk``) is gpt-oss's softmax over the ``k`` largest logits; its 128-token window on layers 0, 2,
... is ``sliding_window`` with ``global_every`` 2 (transformers' sliding-window mask: key ``j`` seen from query ``i``
when ``i - window < j <= i``, as here).

GLM-4.5 (transformers' ``Glm4MoeForCausalLM``; ``glm4_moe`` as :mod:`profiler.hf_config` reads it): DeepSeek-V3's
routing and shared expert (``n_shared_experts`` times the experts' width, no gate) and dense first layers
(``first_k_dense_replace``) beside grouped-query attention with biases on the query, key and value projections only
(``qkv_bias``; ``o`` has none), per-head query/key RMSNorms before the rotary (``use_qk_norm``: ``qk_norm``, as
Qwen3's), half of each head rotated (``rotary_dim``, above) and ``a d != h`` (96 heads of 128 over 4096: ``q`` is
``h -> a d``, ``o`` ``a d -> h``).

OLMo 2, OLMo 3 and OLMoE (transformers' ``Olmo2ForCausalLM``, ``Olmo3ForCausalLM``, ``OlmoeForCausalLM``; Team OLMo
2024, "2 OLMo 2 Furious", section 3.2; ModelSpec's ``qk_norm_scope`` and ``post_norm``): with ``qk_norm_scope``
"projection" the query and key norms are one RMSNorm over the whole query projection (``a d`` weights, ``q_norm``)
and one over the whole key projection (``k d``, ``k_norm``), applied to ``q(x)`` and ``k(x)`` before the split into
heads and before the rotary (``Olmo2Attention``: ``self.q_norm(self.q_proj(x))``); with ``post_norm`` (OLMo 2's
"reordered norm") the attention and the MLP read the residual stream itself and their outputs are normed before each
residual add, ``h = x + attn_out_norm(attend(x))``, ``out = h + mlp_out_norm(mlp(h))`` (``Olmo2DecoderLayer``'s
``post_attention_layernorm`` and ``post_feedforward_layernorm``; the block's ``input_norm`` and ``post_norm`` are
then None). OLMoE is pre-norm with the projection-wide query/key norms and a mixture of experts (softmax routing,
``norm_topk_prob`` false); OLMo 3 is OLMo 2 with a sliding window on three layers of four (``sliding_window``,
``global_every``). Every norm of the hidden width and the query/key norms take the spec's ``norm_eps`` (transformers'
``rms_norm_eps``: 1e-5 by default, OLMo 2's, Qwen's and DeepSeek's 1e-6; :func:`make_norm`).

MiniMax-M2 (transformers' ``MiniMaxM2ForCausalLM``; ``minimax_m2`` as :mod:`profiler.hf_config` reads it) is built of
the pieces above alone: grouped-query attention without biases and ``a d != h``, OLMoE's projection-wide query/key
norms before the rotary (``MiniMaxM2Attention``: ``self.q_norm(self.q_proj(x))``) in a pre-norm block, GLM-4.5's
partial rotary, and on every layer DeepSeek-V3's routing without groups, scaling nor shared expert
(``MiniMaxM2TopKRouter``: sigmoid scores, the choice by score plus ``e_score_correction_bias``, the chosen scores over
their sum). That router divides by the sum alone where :func:`route` adds V3's ``1e-20``: in float32, where both
route, the quotient is the same float for any sum of ``2.3e-13`` or more (``1e-20`` is less than half a float32 step
there), and a sum of chosen sigmoids is at least the largest of them (``sigmoid(-29)`` is ``2.5e-13``).

Llama 4's language model (Meta 2025, "The Llama 4 herd"; transformers' ``Llama4ForCausalLM``, ``Llama4TextAttention``,
``Llama4TextMoe``; ModelSpec's ``nope_layers``, ``rope_interleaved``, ``qk_l2_norm``, ``attention_chunk``,
``query_temperature``, ``router_weights_on_input``; :func:`attention`, in transformers' order): the layers
``ModelSpec.rotary_layer`` names rotate each head's adjacent pairs ``(x_2i, x_2i+1)`` by ``m theta^(-2i/d)`` (its
``apply_rotary_emb``, the pairs as complex numbers, the output left in pairs: :func:`apply_rotary_pairs`),
then normalise each head's query and key without a weight (``Llama4TextWeightlessRMSNorm``, epsilon ``rms_norm_eps``:
:func:`l2_norm`, float32 at least) and attend within chunks (``create_chunked_causal_mask``: query ``i`` sees key ``j
<= i`` of the same ``attention_chunk``); the NoPE layers (``LlamaBlock.theta`` None) have no rotary, no norm, attend
causally over the whole sequence and multiply each query at position ``m`` by ``log1p(floor((m + 1) / floor)) scale +
1`` (``attn_temperature_tuning``: :func:`temperature_scales`, float32 then cast back). Its mixture of experts
(:class:`SparseMoE` with ``on_input``, :func:`mix`) routes by the sigmoid of the top-k logits without renormalisation
(:func:`route` with ``router_score`` sigmoid picks the same experts, the sigmoid being monotone), multiplies each
token's *input* to an expert by its weight and sums the experts' outputs unweighted, plus an ungated shared expert of
the experts' width; its dense layers (``dense_layers``) are the dense MLP of ``intermediate_size_mlp``
(``ffn_hidden``). transformers' ``Llama4TextExperts`` runs every expert on every token (a batched matmul over ``E``
copies of the tokens, those not routed to an expert scaled by a weight of zero); an expert without biases maps zero
to zero (``down(act(gate 0) * up 0) = 0``), so running each expert on its routed tokens only, as here, is the same
function.

Multi-head latent attention (``kv_lora_rank``: DeepSeek-V2/V3; :mod:`executor.models.mla`): the block's attention
is a :class:`~executor.models.mla.LatentAttention` (``LlamaBlock.mla``; ``q``, ``k``, ``v`` and ``o`` None).

DeepSeek-V3's auxiliary-loss-free balancing (section 2.1.2): each :class:`Router` with a bias counts the tokens it
routes to each expert over a step (``Router.expert_load``, int64, forwards only: :func:`not_counted` around a
checkpoint's recomputation), and at the step's end :func:`update_expert_bias` moves the bias by ``gamma sign(mean -
load)`` (:meth:`Router.update_bias`), the loads summed first over every copy of the router (the executor's
:class:`~executor.plan.RunPlan` ``expert_bias_rate``; Megatron-Core's ``get_updated_expert_bias``).

Not built: the auxiliary load-balancing loss (transformers adds it to the loss only with ``output_router_logits``;
its default is off; DeepSeek's sequence-wise balance loss neither), Mixtral's router jitter noise
(``router_jitter_noise``, 0 by default) and expert capacity (no token is dropped). The experts are ``nn.Linear``
modules in an ``nn.ModuleList`` (transformers 5 stores them fused, a 3-D ``gate_up_proj`` ``(E, 2 f_e, h)`` with gate
then up, and ``down_proj`` ``(E, h, f_e)``: the same numbers), which the tensor-parallel shard splits as the dense
MLP (:class:`executor.tensor_parallel.TensorParallelLlamaBlock`).

Llama 3.1's ``rope_scaling`` (long-context frequency rescaling; gpt-oss's YaRN too) changes the angles, not the
cost or the shapes; it is not applied here. Attention is written out (``q @ k^T``, softmax, ``@ v``) as in
:mod:`executor.models.blocks`. Initialisation: N(0, 0.02), the residual projections (``o``, ``down``, each
expert's ``down``, the shared expert's) N(0, 0.02 / sqrt(2 L)) as GPT-2's, norms at one, biases zero; the router
and the shared expert's gate N(0, 0.02), as gpt-oss's attention sinks and router bias (transformers'
``GptOssPreTrainedModel._init_weights``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from executor.models.blocks import INIT_STD, init_linear
from executor.models.config import ModelConfig
from executor.models.gpt import init_token_embedding
from executor.models.mla import LatentAttention, rotary_cos_sin_pairs

#: gpt-oss's ``alpha`` (transformers' ``GptOssExperts.alpha``, ``swiglu_alpha``): ``quick_gelu(x) = x sigmoid(1.702 x)``
QUICK_GELU_ALPHA = 1.702


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """``x sigmoid(1.702 x)`` (Hendrycks & Gimpel 2016, section 2's sigmoid approximation of GELU), in the order
    transformers' ``GptOssExperts._apply_gate`` writes it: ``gate * sigmoid(gate * alpha)``."""
    return x * torch.sigmoid(x * QUICK_GELU_ALPHA)


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu,
               "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "quick_gelu": quick_gelu}


def glu(act: Callable[[torch.Tensor], torch.Tensor], gate: torch.Tensor, up: torch.Tensor, offset: float = 0.0,
        clamp: float | None = None) -> torch.Tensor:
    """A gated MLP's inner activation ``act(gate) * (up + offset)``, with ``clamp`` the gate clamped to at most it and
    ``up`` to ``[-clamp, clamp]`` first (gpt-oss: transformers' ``GptOssExperts._apply_gate``, ``swiglu_limit`` 7 and
    offset 1; Megatron-Core's ``activation_func_clamp_value`` and ``glu_linear_offset``); plain SwiGLU's ``act(gate) *
    up`` without either. Elementwise, so a tensor-parallel shard (gate and up split alike by columns) computes its
    columns of it."""
    if clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(min=-clamp, max=clamp)
    return act(gate) * (up + offset if offset else up)


def make_norm(config: ModelConfig) -> nn.Module:
    """A norm of the hidden width, of the spec's kind and epsilon (``norm_eps``)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden, eps=config.norm_eps)
    return nn.LayerNorm(config.hidden, eps=config.norm_eps)


def rotary_cos_sin(seq: int, head_dim: int, theta: float, device: torch.device,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of the angles ``m theta^(-2i/d)`` for positions ``m < seq``, shape ``(seq, d)``
    (each frequency twice, first half then second half: the rotate-half layout); ``head_dim``: the rotated
    dimensions ``d`` (with partial rotary, ``rotary_dim``: transformers' table of ``int(head_dim *
    partial_rotary_factor)``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64, device=device), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(b, heads, s, d)`` by ``cos, sin (s, r)``: ``x cos + rotate_half(x) sin`` over its first ``r``
    dimensions (all ``d`` when ``r = d``), the other ``d - r`` passed through unchanged (partial rotary:
    transformers' ``apply_rotary_pos_emb`` of Phi-3 and GLM-4.5)."""
    r = cos.shape[-1]
    rot, rest = (x, None) if r == x.shape[-1] else (x[..., :r], x[..., r:])
    half = r // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos + rotated * sin
    return out if rest is None else torch.cat([out, rest], dim=-1)


def apply_rotary_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the adjacent pairs ``(x_2i, x_2i+1)`` of ``x (b, heads, s, d)`` by the angles of ``cos, sin (s, r/2)``
    (:func:`executor.models.mla.rotary_cos_sin_pairs`, ``m theta^(-2i/r)``) over its first ``r`` dimensions, the rest
    passed through: ``x_2i cos - x_2i+1 sin`` and ``x_2i sin + x_2i+1 cos``, the output left in pairs (Llama 4,
    ``ModelSpec.rope_interleaved``: transformers' llama4 ``apply_rotary_emb``, which views each pair as the complex
    number ``x_2i + j x_2i+1``, ``view_as_complex`` of ``reshape(..., -1, 2)``, multiplies it by ``exp(j m
    theta^(-2i/d))`` and flattens ``view_as_real`` back; DeepSeek's rotated pairs are laid out evens then odds
    instead, :func:`executor.models.mla.apply_rotary_interleaved`)."""
    r = 2 * cos.shape[-1]
    rot, rest = (x, None) if r == x.shape[-1] else (x[..., :r], x[..., r:])
    even, odd = rot[..., 0::2], rot[..., 1::2]
    out = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return out if rest is None else torch.cat([out, rest], dim=-1)


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x rsqrt(mean(x^2) + eps)`` over the last dimension, no weight, computed in float32 at least and cast back
    (transformers' ``Llama4TextWeightlessRMSNorm``, Llama 4's ``qk_norm`` of each head's query and key:
    ``ModelSpec.qk_l2_norm``; ``eps`` its ``rms_norm_eps``, the spec's ``norm_eps``). Per row, so a tensor-parallel
    rank's whole heads are normed as the whole block's."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)


def temperature_scales(seq: int, floor: int, scale: float, device: torch.device) -> torch.Tensor:
    """Llama 4's query temperature (``ModelSpec.query_temperature``, transformers' ``Llama4TextAttention`` with
    ``attn_temperature_tuning``, ``floor_scale`` and ``attn_scale``): ``log1p(floor((m + 1) / floor)) scale + 1`` for
    positions ``m < seq``, in float32 as transformers computes it (``positions.float()``): ``(seq,)``."""
    positions = torch.arange(seq, device=device, dtype=torch.float32)
    return torch.log1p(torch.floor((positions + 1.0) / floor)) * scale + 1.0


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap tanh(x / cap)`` (Gemma 2's soft-capping), or ``x`` without a cap."""
    return x if cap is None else torch.tanh(x / cap) * cap


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, theta: float | None,
              cap: float | None = None, window: int | None = None,
              sinks: torch.Tensor | None = None, rotary_dim: int | None = None, *, interleaved: bool = False,
              qk_l2_eps: float | None = None, chunk: int | None = None,
              temperature: tuple[int, float] | None = None) -> torch.Tensor:
    """Causal attention of ``q (b, a', s, d)`` over ``k, v (b, k', s, d)`` with rotary positions (on each head's
    first ``rotary_dim`` dimensions where given, the rest passing through: :func:`apply_rotary`; none where ``theta``
    is None: Llama 4's NoPE layers, ``ModelSpec.rotary_layer``); ``a'`` a multiple of ``k'`` (each key/value head
    serves ``a'/k'`` consecutive query heads); the scores soft-capped at ``cap`` where given; each query within the
    last ``window`` positions (itself included) where given; with ``sinks (a',)`` each head's sink logit in its
    softmax's denominator (:func:`causal_attention`).

    Llama 4 (transformers' ``Llama4TextAttention``, in its order): the rotary on adjacent pairs (``interleaved``:
    :func:`apply_rotary_pairs`);
    then, with ``qk_l2_eps``, each head's query and key through :func:`l2_norm` (its ``qk_norm``, on the rotary layers
    only); then, with ``temperature (floor, scale)``, each query at position ``m`` times
    :func:`temperature_scales` (its NoPE layers), the product cast back to the query's dtype; the keys within their
    query's ``chunk`` of positions where given (:func:`causal_attention`). Every piece is per head or per position,
    so a tensor-parallel rank holding whole heads computes its heads as here.
    Returns ``(b, s, a' d)``."""
    b, heads, s, d = q.shape
    r = d if rotary_dim is None else rotary_dim
    if theta is not None and interleaved:
        cos, sin = rotary_cos_sin_pairs(s, r, theta, q.device, q.dtype)
        q, k = apply_rotary_pairs(q, cos, sin), apply_rotary_pairs(k, cos, sin)
    elif theta is not None:
        cos, sin = rotary_cos_sin(s, r, theta, q.device, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if qk_l2_eps is not None:
        q, k = l2_norm(q, qk_l2_eps), l2_norm(k, qk_l2_eps)
    if temperature is not None:
        q = (q * temperature_scales(s, *temperature, q.device).view(s, 1)).to(q.dtype)
    group = heads // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return causal_attention(q, k, v, cap, window, sinks, chunk)


#: a block's per-layer settings of :func:`attention`, its attributes of these names (a tensor-parallel shard copies
#: them: :func:`block_attention` serves both)
ATTENTION_SETTINGS = ("theta", "cap", "window", "rotary_dim", "interleaved", "qk_l2_eps", "chunk", "temperature")


def block_attention(block: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    fn: Callable[..., torch.Tensor] = attention) -> torch.Tensor:
    """``fn`` (:func:`attention`) of ``q, k, v`` with ``block``'s settings (:data:`ATTENTION_SETTINGS`) and sinks."""
    return fn(q, k, v, sinks=block.sinks, **{name: getattr(block, name) for name in ATTENTION_SETTINGS})


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cap: float | None = None,
                     window: int | None = None, sinks: torch.Tensor | None = None,
                     chunk: int | None = None) -> torch.Tensor:
    """``softmax(mask(cap(q k^T / sqrt(d)))) v`` of ``q, k (b, a', s, d)`` and ``v (b, a', s, d_v)`` (positions
    already applied, one key/value head per query head), causal, within the last ``window`` positions where given,
    within the query's ``chunk`` where given (Llama 4's chunked attention: query ``i`` sees key ``j`` when ``j <= i``
    and ``i // chunk == j // chunk``, transformers' ``create_chunked_causal_mask``).

    With ``sinks (a',)`` (gpt-oss's attention sinks, ``ModelSpec.attention_sinks``): head ``i``'s logit
    ``sinks[i]`` joins every row of its scores as one more column, the softmax runs over the ``s + 1`` columns and
    the sink's column is dropped, attending to no value (transformers' ``GptOssAttention.sinks`` as its
    ``eager_attention_forward`` computes it: the sink column concatenated to the masked scores, the row's maximum
    subtracted, softmax, the column dropped; the maximum detached here, the softmax being shift-invariant: the same
    forward, and the same gradient without a path through the maximum); a row's weights then sum to less than one. A
    soft-cap applies to the scores, not to the sink. The attention is written out, no fused kernel: PyTorch's
    ``scaled_dot_product_attention`` takes no sink. Returns ``(b, s, a' d_v)``."""
    b, heads, s, d = q.shape
    att = softcap((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d)), cap)
    ones = torch.ones(s, s, dtype=torch.bool, device=q.device)
    mask = ones.tril() if window is None else ones.tril() & ones.triu(1 - window)
    if chunk is not None:
        block = torch.arange(s, device=q.device) // chunk
        mask = mask & (block[:, None] == block[None, :])
    att = att.masked_fill(~mask, float("-inf"))
    if sinks is None:
        att = F.softmax(att, dim=-1)
    else:
        att = torch.cat([att, sinks.to(att.dtype).view(1, heads, 1, 1).expand(b, heads, s, 1)], dim=-1)
        att = F.softmax(att - att.amax(dim=-1, keepdim=True).detach(), dim=-1)[..., :-1]
    return (att @ v).transpose(1, 2).reshape(b, s, heads * v.shape[-1])


class LlamaEmbedding(nn.Module):
    """Token embedding (the weight is ``tok.weight``, as in the GPT zoo, for tying)."""

    takes_targets = False

    def __init__(self, config: ModelConfig, token_seed: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab, config.hidden)
        init_token_embedding(self.tok.weight, token_seed)
        self.scale = math.sqrt(config.hidden) if config.embedding_scale else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        return x if self.scale is None else x * self.scale


class Expert(nn.Module):
    """One expert of a :class:`SparseMoE`: an MLP of width ``f_e`` (``width``: another, the shared expert's) of the
    dense MLP's form, ``down(act(gate(x)) * up(x))`` (gated; gpt-oss's clamp and offset, :func:`glu`) or
    ``down(act(up(x)))``, biases as the spec says (gpt-oss: transformers' ``GptOssExperts``, whose fused
    ``gate_up_proj[e] (h, 2 f_e)`` holds this expert's gate in its even columns and up in its odd ones, with
    ``gate_up_proj_bias[e]`` alike, and ``down_proj[e] (f_e, h)`` with ``down_proj_bias[e]``: the transposes of
    ``gate.weight``, ``up.weight`` and ``down.weight``)."""

    def __init__(self, config: ModelConfig, residual_std: float, width: int | None = None) -> None:
        super().__init__()
        h, f = config.hidden, config.f_e if width is None else width
        self.act = ACTIVATIONS[config.activation]
        self.offset, self.clamp = config.glu_linear_offset, config.glu_clamp
        self.gate = nn.Linear(h, f, bias=config.bias) if config.gated_mlp else None
        self.up = nn.Linear(h, f, bias=config.bias)
        self.down = nn.Linear(f, h, bias=config.bias)
        for lin in (self.gate, self.up):
            if lin is not None:
                init_linear(lin)
        init_linear(self.down, residual_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = (glu(self.act, self.gate(x), self.up(x), self.offset, self.clamp) if self.gate is not None
                 else self.act(self.up(x)))
        return self.down(inner)


def route(logits: torch.Tensor, top_k: int, normalize: bool, dtype: torch.dtype, score: str = "softmax",
          groups: int | None = None, group_topk: int | None = None, bias: torch.Tensor | None = None,
          scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts and their weights from the router's ``logits (T, E)`` (module docstring,
    routing): the scores in float32, the softmax over the ``E`` experts (``score`` "softmax": transformers'
    ``Qwen3MoeTopKRouter``, ``DeepseekV2TopkRouter``) or each one's sigmoid ("sigmoid": ``DeepseekV3TopkRouter``);
    the choice among the scores plus ``bias (E,)`` where given (V3's ``e_score_correction_bias``), within each
    token's ``group_topk`` best of ``groups`` groups of consecutive experts where given (a group's score its best
    expert's with softmax scores, V2's ``group_limited_greedy``; its best two's sum with sigmoid scores, V3's
    ``noaux_tc``); the chosen experts' scores (without the bias) as weights, renormalised to sum to one when
    ``normalize``, times ``scaling`` (``routed_scaling_factor``), cast to ``dtype``. Returns ``weights (T, k)`` and
    ``index (T, k)``."""
    logits = logits.float()
    scores = F.softmax(logits, dim=-1) if score == "softmax" else torch.sigmoid(logits)
    choice = scores if bias is None else scores + bias
    if groups is not None and group_topk is not None:
        T, E = choice.shape
        per_group = choice.view(T, groups, E // groups)
        group_scores = (per_group.max(dim=-1).values if score == "softmax"
                        else per_group.topk(min(2, E // groups), dim=-1).values.sum(dim=-1))
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(group_topk, dim=-1).indices, 1.0)
        mask = keep.bool().unsqueeze(-1).expand(T, groups, E // groups).reshape(T, E)
        choice = choice.masked_fill(~mask, float("-inf"))
    if choice is scores:
        weights, index = torch.topk(scores, top_k, dim=-1)
    else:
        index = torch.topk(choice, top_k, dim=-1).indices
        weights = scores.gather(1, index)
    if normalize:
        total = weights.sum(dim=-1, keepdim=True)
        weights = weights / (total + 1e-20 if score == "sigmoid" else total)  # (V3's denominator; Qwen3's none)
    if scaling != 1.0:
        weights = weights * scaling
    return weights.to(dtype), index


#: how many :func:`not_counted` contexts are open (one count for every thread: a checkpoint's recomputation may run
#: on the autograd engine's device thread)
_UNCOUNTED = 0


class not_counted:  # noqa: N801 - used as a function-like context manager, as torch.no_grad
    """Forwards inside it add nothing to the routers' loads (:attr:`Router.expert_load`): a checkpoint's
    recomputation during the backward (the forward it repeats counted already), a reference's second pass. One
    object may be entered again (a checkpoint recomputes with its context in every backward call through it)."""

    def __enter__(self) -> None:
        global _UNCOUNTED
        _UNCOUNTED += 1

    def __exit__(self, *exc: object) -> None:
        global _UNCOUNTED
        _UNCOUNTED -= 1


class Router(nn.Linear):
    """A mixture of experts' router: ``nn.Linear(h, E)``, with a bias when the spec's linears have one (``bias``:
    gpt-oss's ``GptOssTopKRouter``, ``F.linear(x, weight, bias)``, a trained parameter, N(0, 0.02) as transformers'
    ``GptOssPreTrainedModel._init_weights``; Mixtral, Qwen and DeepSeek have none), whose :meth:`choose` routes tokens
    by the spec's rule (:func:`route`: ``experts_per_token``, ``normalize_topk``, ``router_score``, ``router_groups`` /
    ``router_group_topk``, ``routed_scaling``), with ``router_bias`` the per-expert bias of the choice
    (``expert_bias``, DeepSeek-V3's ``e_score_correction_bias``): a buffer of zeros, float32 as DeepSeek keeps it
    (the model's dtype once the model is cast), not a parameter (no gradient, no optimizer); it travels with the
    router (tensor- and expert-parallel copies share the router, so every rank holds the same).

    DeepSeek-V3 moves the bias between steps by the experts' load (its auxiliary-loss-free balancing, section
    2.1.2): with a bias, every training forward (autograd on, as Megatron-Core counts; outside :func:`not_counted`)
    adds the number of tokens it routed to each expert to ``expert_load`` (an int64 buffer, not in the state dict),
    and :meth:`update_bias` applies the
    step's rule to the loads summed over the router's copies (:func:`update_expert_bias`)."""

    def __init__(self, config: ModelConfig) -> None:
        E = int(config.experts)  # type: ignore[arg-type]
        super().__init__(config.hidden, E, bias=config.bias)
        self.top_k, self.normalize = int(config.experts_per_token), config.normalize_topk  # type: ignore[arg-type]
        self.score, self.scaling = config.router_score, config.routed_scaling
        self.groups, self.group_topk = config.router_groups, config.router_group_topk
        self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32) if config.router_bias else None)
        self.register_buffer("expert_load", torch.zeros(E, dtype=torch.int64) if config.router_bias else None,
                             persistent=False)

    def choose(self, tokens: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``weights, index (T, k)`` of ``tokens (T, h)`` (:func:`route`), the weights in ``dtype``; with a bias the
        choices are added to ``expert_load`` (training forwards: with autograd on, outside :func:`not_counted`)."""
        weights, index = route(self(tokens), self.top_k, self.normalize, dtype, self.score, self.groups,
                               self.group_topk, self.expert_bias, self.scaling)
        if self.expert_load is not None and not _UNCOUNTED and torch.is_grad_enabled():
            with torch.no_grad():
                self.expert_load += torch.bincount(index.reshape(-1), minlength=self.expert_load.numel())
        return weights, index

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor, rate: float) -> None:
        """DeepSeek-V3's update (section 2.1.2; Megatron-Core's ``get_updated_expert_bias``): ``bias += rate
        sign(mean(load) - load)`` for the step's ``load (E,)`` (int64, summed over the router's copies: an expert
        above the mean loses ``rate``, one below gains it, one at it keeps its bias), then ``expert_load`` is reset.
        The sign is taken exactly, in integers (``sum(load) - E load``)."""
        assert self.expert_bias is not None and self.expert_load is not None
        load = load.to(device=self.expert_load.device, dtype=torch.int64)
        if rate:
            offset = load.sum() - load.numel() * load  # E (mean - load)
            self.expert_bias += rate * torch.sign(offset).to(self.expert_bias.dtype)
        self.expert_load.zero_()


def biased_routers(module: nn.Module) -> list[Router]:
    """The routers with a bias in ``module``, in module order (the same order on every copy of the module)."""
    return [m for m in module.modules() if isinstance(m, Router) and m.expert_bias is not None]


def expert_bias_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``"{router's name}.expert_bias" -> a copy`` of every biased router of ``module``: buffers, which a comparison of
    parameters (``named_parameters``) would miss."""
    return {f"{n}.expert_bias": m.expert_bias.detach().clone() for n, m in module.named_modules()
            if isinstance(m, Router) and m.expert_bias is not None}


def expert_loads(copies: Sequence[nn.Module]) -> torch.Tensor | None:
    """The step's loads of every biased router of ``copies`` (modules of the same layers held by one process, of which
    only one may have run), summed over the copies, the routers' one after another in one int64 tensor; None without
    a biased router."""
    per_copy = [biased_routers(m) for m in copies]
    if not per_copy or not per_copy[0]:
        return None
    return torch.stack([torch.cat([r.expert_load for r in routers]) for routers in per_copy]).sum(dim=0)


def apply_expert_loads(copies: Sequence[nn.Module], total: torch.Tensor, rate: float) -> None:
    """Every copy's biased routers updated with their part of ``total`` (:func:`expert_loads`' layout, summed over
    every copy of the layers in the job: :meth:`Router.update_bias`, the same update on every copy, so they stay
    equal) and their loads reset."""
    for module in copies:
        routers = biased_routers(module)
        for router, load in zip(routers, total.split([r.expert_load.numel() for r in routers]), strict=True):
            router.update_bias(load, rate)


def update_expert_bias(copies: Sequence[nn.Module], rate: float,
                       reduce: Callable[[torch.Tensor], Any] | None = None) -> None:
    """End of a step (:func:`expert_loads`, then :func:`apply_expert_loads`): ``reduce``, where given, sums the loads in
    place over the other processes holding copies of the layers (e.g. ``dist.all_reduce`` on their group)."""
    total = expert_loads(copies)
    if total is None:
        return
    if reduce is not None:
        reduce(total)
    apply_expert_loads(copies, total, rate)


def mix(x: torch.Tensor, weights: torch.Tensor, index: torch.Tensor,
        experts: list[Callable[[torch.Tensor], torch.Tensor]], on_input: bool = False) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] experts[index[t, j]](x[t])`` for tokens ``x (T, h)``: one expert at a time
    on the tokens routed to it, as transformers' eager experts (the planner's ``expert_gemm="sequential"``,
    :mod:`planner.moe`); an expert routed no token runs on an empty batch, so that its weights still get a
    gradient, of zeros (every rank and stage holds the same set of gradients). ``on_input`` (Llama 4's
    ``router_weights_on_input``): ``out[t] = sum_j experts[index[t, j]](weights[t, j] x[t])``, each weight scaling the
    token's input to its expert and the outputs summed unweighted (transformers' ``Llama4TextMoe``)."""
    out = x.new_zeros(x.shape[0], x.shape[1])
    for e, expert in enumerate(experts):
        token, slot = torch.where(index == e)
        w = weights[token, slot, None]
        out = out.index_add(0, token, expert(x[token] * w) if on_input else expert(x[token]) * w)
    return out


def shared_output(moe: nn.Module, tokens: torch.Tensor) -> torch.Tensor | None:
    """The shared expert's output on ``tokens (T, h)``, times ``sigmoid(tokens w)`` with a gate (transformers'
    ``Qwen2MoeSparseMoeBlock``), or None without a shared expert. ``moe``: a :class:`SparseMoE` or one of its
    parallel forms, whose ``shared_expert`` computes the whole output (a tensor-parallel one all-reduces its own) and
    whose ``shared_expert_gate`` (replicated) reads the whole input."""
    if moe.shared_expert is None:
        return None
    y = moe.shared_expert(tokens)
    return y if moe.shared_expert_gate is None else torch.sigmoid(moe.shared_expert_gate(tokens)) * y


class SparseMoE(nn.Module):
    """A sparse mixture-of-experts MLP (module docstring): a router ``nn.Linear(h, E)`` (:class:`Router`) and ``E``
    :class:`Expert` s; each token's output is the routing-weighted sum of its ``experts_per_token`` experts' outputs,
    plus the shared expert's (gated) output where the spec has one. No auxiliary load-balancing loss: transformers
    adds one only with ``output_router_logits``."""

    def __init__(self, config: ModelConfig, residual_std: float) -> None:
        super().__init__()
        self.top_k, self.normalize = int(config.experts_per_token), config.normalize_topk  # type: ignore[arg-type]
        self.on_input = config.router_weights_on_input  # (Llama 4: the weights scale the experts' inputs; mix)
        self.router = Router(config)
        init_linear(self.router)
        if self.router.bias is not None:  # (gpt-oss's, as transformers initialises it)
            nn.init.normal_(self.router.bias, 0.0, INIT_STD)
        self.experts = nn.ModuleList(Expert(config, residual_std) for _ in range(int(config.experts)))  # type: ignore[arg-type]
        width = config.shared_expert_ffn_hidden
        self.shared_expert = Expert(config, residual_std, width) if width is not None else None
        self.shared_expert_gate = nn.Linear(config.hidden, 1, bias=False) if config.shared_expert_gate else None
        if self.shared_expert_gate is not None:
            init_linear(self.shared_expert_gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, index = self.router.choose(tokens, x.dtype)
        out = mix(tokens, weights, index, list(self.experts), self.on_input)
        shared = shared_output(self, tokens)
        return (out if shared is None else out + shared).view(x.shape)


class LlamaBlock(nn.Module):
    """Pre-norm block: ``x + o(attn(rope(q), rope(k), v))`` then ``x + mlp(norm(x))`` (module docstring); with
    ``post_norm`` (OLMo 2) the branches read ``x`` and their outputs are normed instead."""

    takes_targets = False

    def __init__(self, config: ModelConfig, index: int = 0) -> None:
        super().__init__()
        h, d = config.hidden, config.d
        # transformer layer ``index``'s sliding window (None: causal over all) and rotary base (ModelSpec)
        self.window = config.sliding_window if config.local_layer(index) else None
        # Llama 4 (module docstring): rotary positions or none (a NoPE layer: theta None), on adjacent pairs; each
        # head's query and key L2-normed on the rotary layers; the keys within the query's chunk on the rotary layers
        # (ModelSpec.layer_chunk where the chunk is shorter than the spec's sequence; here at any length, the same
        # function); the queries' temperature on the NoPE layers
        rotary = config.rotary_layer(index)
        self.interleaved = config.rope_interleaved
        self.qk_l2_eps = config.norm_eps if config.qk_l2_norm and rotary else None
        self.chunk = config.attention_chunk if rotary else None
        self.temperature = config.query_temperature if not rotary else None
        qkv_bias = config.bias or config.qkv_bias
        self.heads, self.kv_heads, self.head_dim = config.heads, config.k, d
        self.rotary_dim = config.rot_d  # (the dimensions of each head rotated: rotary_dim, else all d)
        self.theta = config.layer_rope_theta(index) if rotary else None
        self.cap = config.attention_softcap
        self.gated = config.gated_mlp
        self.act = ACTIVATIONS[config.activation]
        self.offset, self.clamp = config.glu_linear_offset, config.glu_clamp  # (gpt-oss's gate: glu)
        # OLMo 2's reordered norm (post_norm): no norm on the attention's nor on the MLP's input
        self.input_norm = None if config.post_norm else make_norm(config)
        # the query and key norms: over each head (Qwen3: one weight of d) or over the whole projections (OLMo 2,
        # OLMoE: qk_norm_scope "projection", a d and k d weights, before the split into heads)
        self.projection_norms = config.qk_norm and config.qk_norm_scope == "projection"
        q_width, k_width = (config.q_dim, config.kv_dim) if self.projection_norms else (d, d)
        self.q_norm = nn.RMSNorm(q_width, eps=config.norm_eps) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(k_width, eps=config.norm_eps) if config.qk_norm else None
        residual_std = INIT_STD / math.sqrt(2 * config.layers)
        # multi-head latent attention (kv_lora_rank; executor.models.mla) in place of q, k, v and o
        self.mla = (LatentAttention(config, residual_std, config.layer_rope_theta(index), self.cap, self.window)
                    if config.mla else None)
        standard = self.mla is None
        self.q = nn.Linear(h, config.q_dim, bias=qkv_bias) if standard else None
        self.k = nn.Linear(h, config.kv_dim, bias=qkv_bias) if standard else None
        self.v = nn.Linear(h, config.kv_dim, bias=qkv_bias) if standard else None
        self.o = nn.Linear(config.q_dim, h, bias=config.bias) if standard else None
        # gpt-oss's attention sinks: one logit per query head (transformers' GptOssAttention.sinks, N(0, 0.02))
        self.sinks = nn.Parameter(torch.empty(config.heads)) if config.attention_sinks else None
        if self.sinks is not None:
            nn.init.normal_(self.sinks, 0.0, INIT_STD)
        self.post_norm = None if config.post_norm else make_norm(config)  # (the MLP's input norm)
        # Gemma 2's sandwich and OLMo 2's reordered norm: the attention's and the MLP's outputs normed before their
        # residual adds (transformers' post_attention_layernorm and post_feedforward_layernorm)
        out_norms = config.sandwich_norm or config.post_norm
        self.attn_out_norm = make_norm(config) if out_norms else None
        self.mlp_out_norm = make_norm(config) if out_norms else None
        # the MLP: dense (gate, up, down; a model without experts, or one of its dense_layers) or a mixture of
        # experts (moe; gate, up and down None)
        self.moe = SparseMoE(config, residual_std) if config.moe_layer(index) else None
        dense = self.moe is None
        self.gate = nn.Linear(h, config.f, bias=config.bias) if config.gated_mlp and dense else None
        self.up = nn.Linear(h, config.f, bias=config.bias) if dense else None
        self.down = nn.Linear(config.f, h, bias=config.bias) if dense else None
        for lin in (self.q, self.k, self.v, self.gate, self.up):
            if lin is not None:
                init_linear(lin)
        if self.o is not None:
            init_linear(self.o, residual_std)
        if self.down is not None:
            init_linear(self.down, residual_std)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        if self.mla is not None:
            return self.mla(x)
        b, s, _ = x.shape
        d = self.head_dim
        q, k = self.q(x), self.k(x)
        if self.q_norm is not None and self.k_norm is not None and self.projection_norms:
            q, k = self.q_norm(q), self.k_norm(k)  # (OLMo 2: over the whole projections, before the heads)
        q, k = q.view(b, s, -1, d), k.view(b, s, -1, d)
        if self.q_norm is not None and self.k_norm is not None and not self.projection_norms:
            q, k = self.q_norm(q), self.k_norm(k)  # (Qwen3: over each head)
        v = self.v(x).view(b, s, -1, d).transpose(1, 2)
        return self.o(block_attention(self, q.transpose(1, 2), k.transpose(1, 2), v))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe(x)
        if self.gate is not None:
            return self.down(glu(self.act, self.gate(x), self.up(x), self.offset, self.clamp))
        return self.down(self.act(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sandwich_forward(self, x, self.attend, self.mlp)


def _normed(norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
    return x if norm is None else norm(x)


def sandwich_forward(block: nn.Module, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor],
                     mlp: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``x + out1(attend(input_norm(x)))``, then ``x + out2(mlp(post_norm(x)))``, where ``out1``/``out2`` are the
    block's ``attn_out_norm``/``mlp_out_norm`` (Gemma 2, OLMo 2) or nothing (pre-norm), and ``input_norm`` /
    ``post_norm`` nothing with OLMo 2's reordered norm (``post_norm``: the branches read the residual stream): one
    order for the block and its tensor-parallel shard."""
    x = x + _normed(block.attn_out_norm, attend(_normed(block.input_norm, x)))
    return x + _normed(block.mlp_out_norm, mlp(_normed(block.post_norm, x)))


class LlamaHead(nn.Module):
    """Final norm, LM head without bias (``weight``, ``(V, h)``), mean cross-entropy over all positions."""

    takes_targets = True

    def __init__(self, config: ModelConfig, token_seed: int) -> None:
        super().__init__()
        self.norm = make_norm(config)
        self.cap = config.logit_softcap
        self.weight = nn.Parameter(torch.empty(config.vocab, config.hidden))
        if config.tied_embeddings:
            init_token_embedding(self.weight, token_seed)
        else:
            nn.init.normal_(self.weight, 0.0, INIT_STD)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return softcap(F.linear(self.norm(x), self.weight), self.cap)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def make_layer(config: ModelConfig, index: int, token_seed: int) -> nn.Module:
    """Layer ``index`` of ``range(config.layers + 2)``."""
    if index == 0:
        return LlamaEmbedding(config, token_seed)
    if index <= config.layers:
        return LlamaBlock(config, index - 1)
    return LlamaHead(config, token_seed)
