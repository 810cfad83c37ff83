"""One description of a transformer model, read by every part that needs a model's shape.

The analytical profile (:mod:`planner.analytic`), the operator-level cost model and the executor's model
builder all read a :class:`ModelSpec`; presets are defined once, in :data:`PRESETS`. Torch-free and
transformers-free (a Hugging Face ``config.json`` is turned into a ``ModelSpec`` at the edge).

Symbols (Megatron-LM SC'21 appendix; Llama 2/3 papers): ``l`` layers, ``h`` hidden, ``a`` query heads,
``k`` key/value heads (grouped-query attention, Ainslie et al. 2023; ``k == a`` is multi-head attention),
``d`` head dimension (``h / a`` unless stated), ``f`` MLP intermediate size (``4h`` for GPT-2/3),
``V`` vocabulary, ``s`` sequence length.

Parameters per layer:

* attention: ``h (a d) + 2 h (k d) + (a d) h`` weights (Q, K, V, output), plus ``a d + 2 k d + h`` biases
  when the model has biases (GPT-2/3, BERT; Llama has none; Qwen2 has the ``a d + 2 k d`` of Q, K, V only);
* MLP: ``2 h f`` weights (up, down), ``3 h f`` with a gated MLP (SwiGLU, Shazeer 2020: gate, up, down),
  plus ``f + h`` biases (up and down) when the model has biases, ``2f + h`` gated (gate, up and down);
* norms: two per layer, ``2h`` each for LayerNorm (weight and bias), ``h`` for RMSNorm; with ``qk_norm``
  (Qwen3: an RMSNorm over each head's query and key, before the rotary) ``2d`` more, one ``d`` weight each; with
  ``sandwich_norm`` (Gemma 2: a norm on the attention's and the MLP's output too, before each residual add; the
  Hugging Face code's ``post_attention_layernorm`` and ``post_feedforward_layernorm``) two more; with ``post_norm``
  (OLMo 2, Team OLMo 2024, "2 OLMo 2 Furious", section 3.2: the "reordered norm") those two only, none on the
  inputs; ``qk_norm_scope`` projection (OLMo 2's and OLMoE's ``q_norm`` of ``a d`` and ``k_norm`` of ``k d``: one
  RMSNorm over the whole query projection and one over the key projection) ``a d + k d`` for the two.

Gemma (Gemma Team 2024, "Gemma: Open Models Based on Gemini Research and Technology", section 2; "Gemma 2:
Improving Open Language Models at a Practical Size", section 2, Table 1): ``embedding_scale`` multiplies the token
embeddings by ``sqrt(h)``; Gemma 2 soft-caps the attention scores (``attention_softcap``: ``cap tanh(x / cap)``
before the softmax, cap 50) and the final logits (``logit_softcap``, cap 30). None of the three has parameters;
each is an elementwise pass the operator model costs (:mod:`planner.operators`).

With GPT-2 shapes (``k = a``, ``d = h/a``, ``f = 4h``, biases, LayerNorm) that is ``12 h^2 + 13 h``.

Mixture of experts (Shazeer et al. 2017; Fedus et al. 2022, "Switch Transformers", section 2.1; Jiang et al. 2024,
"Mixtral of Experts", section 2.1): with ``experts = E`` every layer's MLP is ``E`` MLPs of width ``f_e``
(``expert_ffn_hidden``, default ``ffn_hidden``), each of the dense MLP's form (gated or not), and a router, a
linear ``h -> E`` without bias; each token runs through the ``experts_per_token = k`` experts of largest router
score, their outputs summed with the softmax of the scores as weights (``normalize_topk``: renormalised over the
``k`` chosen, Mixtral; else the softmax over all ``E`` as it is). MLP parameters: ``E (3 h f_e) + h E`` gated
(Mixtral 8x7B: ``8 x 3 x 4096 x 14336 + 4096 x 8`` per layer, 46.7B in all, section 2); a token's compute is
that of ``k`` experts (12.9B active).

Shared experts and dense layers (Dai et al. 2024, "DeepSeekMoE", section 3.2: shared experts every token runs beside
the routed ones; Qwen Team 2024, "Qwen1.5-MoE" and transformers' ``Qwen2MoeSparseMoeBlock``: one shared expert of
width ``shared_expert_intermediate_size``, its output scaled by ``sigmoid(x w)``; Megatron-Core's
``SharedExpertMLP``, ``--moe-shared-expert-intermediate-size`` and ``--moe-shared-expert-gate``): a shared expert
is one MLP of the dense form and width ``f_s`` (``shared_expert_ffn_hidden``; DeepSeek's ``n`` shared experts of
width ``f_e`` are one of ``n f_e``, as its code builds them), ``3 h f_s`` parameters gated, plus ``h`` with its gate;
it is not an expert expert parallelism splits: it is split over ``t`` as the dense MLP. ``dense_layers``: the layers
whose MLP is the dense one of width ``f`` (Qwen3 MoE's ``mlp_only_layers``, DeepSeek-V3's ``first_k_dense_replace
= 3``: layers 0-2; Megatron-Core's ``--moe-layer-freq``). Qwen1.5-MoE-A2.7B (24 layers, h 2048, 60 experts of 1408,
top 4, a gated shared expert of 5632): 14.3B parameters, as its model card states.

Routing variants (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1.2 and "DeepSeek-V3", section 2.1.2; transformers'
``DeepseekV2TopkRouter``, ``DeepseekV3TopkRouter``; Megatron-Core's ``--moe-router-score-function``,
``--moe-router-num-groups``, ``--moe-router-group-topk``, ``--moe-router-enable-expert-bias``,
``--moe-router-topk-scaling-factor``): ``router_score`` softmax or sigmoid; ``router_groups`` / ``router_group_topk``:
the ``E`` experts in ``n`` groups, a token choosing its top-k within its best ``m`` groups (a group's score: its best
expert's with softmax scores, V2's ``group_limited_greedy``; the sum of its best two with sigmoid scores, V3's
``noaux_tc``); ``router_bias``: V3's per-expert bias on the scores for the choice only (a buffer, no parameter);
``routed_scaling``: the chosen weights times it. Each is a few operations per score: costed as the routing is.

Multi-head latent attention (DeepSeek-V2, section 2.1.1, eq. 9-19; transformers' ``DeepseekV3Attention``;
Megatron-Core's ``MLASelfAttention``): with ``kv_lora_rank = c`` each token's keys and values come from a latent of
width ``c`` (``W^DKV``, ``h x (c + r)`` with the shared rotated key of ``r = qk_rope_head_dim``, an RMSNorm of ``c``,
then ``W^UKV``, ``c x a (d - r + v)``), its queries from one of ``q_lora_rank = c'`` (``h c'``, an RMSNorm, ``c' a
d``; or ``h a d`` directly without), the output projection ``a v x h``; ``d = head_dim`` is the query/key width (192:
128 from the latent, 64 rotated), ``v = v_head_dim`` the value's (128). DeepSeek-V3 (61 layers, h 7168, 128 heads,
the first 3 dense, 256 routed experts of 2048 and one shared, top 8 in 4 of 8 groups): 671.0B parameters, 37.6B
active (section 1: 671B, 37B); its multi-token prediction module (14B more on the Hub) is not in transformers' model
nor here.

gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", section 2.1; transformers' ``GptOssAttention``,
``GptOssExperts``, ``GptOssTopKRouter``): ``attention_sinks``, a learned logit per query head that joins every
softmax's denominator and attends to no value (``a`` parameters per layer); biases on every linear layer
(``bias``: the attention's four, the experts' ``2 f_e + h`` each and the router's ``E``); the gate ``quick_gelu``
(``x sigmoid(1.702 x)``) with ``glu_clamp`` 7 (the gate clamped to at most 7, the up projection to [-7, 7]) and
``glu_linear_offset`` 1 (``act(gate) (up + 1)``); the router's softmax over the k largest logits, which is the
softmax over all renormalised over the k (``normalize_topk``); a 128-token window on every other layer from the
first. gpt-oss-120b (36 layers, h 2880, 64 heads of 64, 8 key/value heads, 128 experts of 2880, top 4, vocabulary
201,088): 116.8B parameters, 5.1B active (the card's Table 1).

Llama 4 (Meta 2025, "The Llama 4 herd"; transformers' ``Llama4TextAttention``, ``Llama4TextMoe``; Megatron-Core's
``--no-rope-freq``, ``--qk-l2-norm``, ``--moe-apply-probs-on-input``): ``nope_layers`` have no rotary positions
(every fourth layer; Yang et al. 2025, "Rope to Nope and Back Again: A New Hybrid Attention Strategy"), the others
rotate adjacent pairs (``rope_interleaved``), normalise each head's query and key without a weight
(``qk_l2_norm``: Scout, not Maverick) and attend within chunks of ``attention_chunk`` positions (8192: at a shorter
sequence, causal attention); on the NoPE layers the queries are scaled by ``query_temperature`` (1 below position
8191). Its mixture of experts routes each token to one expert by the sigmoid of its router logit, without
renormalisation (``router_score`` sigmoid, ``normalize_topk`` false), scales the expert's input by that weight
rather than its output (``router_weights_on_input``) and adds a shared expert of the experts' width; Maverick's
even layers are dense, ``intermediate_size_mlp`` wide (``dense_layers``). None of these has parameters: Llama 4
Scout's language model (48 layers, h 5120, 40 heads of 128, 8 key/value heads, 16 experts of 8192 and a shared one,
vocabulary 202,048) has 107,769,861,120, as transformers' ``Llama4ForCausalLM`` counts them.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.limits import SHAPE_LIMITS


def tensor_split_error(heads: int, t: int, kv_heads: int | None = None) -> str | None:
    """Why ``t`` tensor-parallel ranks cannot split a layer of ``heads`` attention heads (``kv_heads`` key/value
    heads with grouped-query attention; None: as many as ``heads``), or None when they can: Megatron-LM splits
    attention by heads, each rank holding ``heads / t`` whole query heads and ``kv_heads / t`` whole key/value
    groups (``megatron/core/transformer/attention.py``: ``divide(num_attention_heads, world_size)`` and
    ``divide(num_query_groups, world_size)`` assert the divisions; Shoeybi et al. 2019, section 3, Figure 3b),
    and torchtitan's column-wise split of the Q, K, V projections needs the same. Pipeplan's executor and
    operator model replicate key/value heads fewer than ``t`` (:func:`planner.operators._shard`), so the search
    checks ``heads`` only; the framework exports check ``kv_heads`` too."""
    if heads % t:
        return (f"tensor: t = {t} does not divide the model's {heads} attention heads (Megatron-LM and torchtitan "
                "give each tensor-parallel rank whole heads)")
    if kv_heads is not None and kv_heads % t:
        return (f"tensor: t = {t} does not divide the model's {kv_heads} key/value heads (Megatron-LM and "
                "torchtitan give each tensor-parallel rank whole key/value groups)")
    return None


class ModelSpec(BaseModel):
    """Shape of a transformer language model (decoder, GPT/Llama-style, or encoder, BERT-style)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    architecture: Literal["decoder", "encoder"] = "decoder"
    # bounded (planner.limits.SHAPE_LIMITS): far above every published model, far below any overflow
    layers: int = Field(gt=0, le=SHAPE_LIMITS["layers"])
    hidden: int = Field(gt=0, le=SHAPE_LIMITS["hidden"])
    heads: int = Field(gt=0, le=SHAPE_LIMITS["heads"], description="query heads")
    kv_heads: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["kv_heads"],
                                 description="key/value heads (GQA); default: heads")
    head_dim: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["head_dim"],
                                 description="default: hidden / heads")
    ffn_hidden: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["ffn_hidden"],
                                   description="MLP intermediate size; default: 4 hidden")
    gated_mlp: bool = Field(default=False, description="SwiGLU-style gate, up and down projections")
    activation: Literal["gelu", "gelu_tanh", "silu", "relu", "quick_gelu"] = Field(
        default="gelu", description="gelu_tanh: GELU's tanh approximation (Gemma's gelu_pytorch_tanh); quick_gelu: "
                                    "x sigmoid(1.702 x) (gpt-oss's gate); each the same cost")
    glu_linear_offset: float = Field(default=0.0, allow_inf_nan=False, exclude_if=lambda v: v == 0.0,
                                     description="with a gated MLP: act(gate) * (up + offset) (gpt-oss: 1; "
                                                 "Megatron-Core's glu_linear_offset)")
    glu_clamp: float | None = Field(default=None, gt=0, allow_inf_nan=False, exclude_if=lambda v: v is None,
                                    description="with a gated MLP: the gate clamped to at most it and the up "
                                                "projection to [-it, it] before the activation (gpt-oss's "
                                                "swiglu_limit: 7; Megatron-Core's activation_func_clamp_value)")
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = Field(default=1e-5, gt=0, lt=1, allow_inf_nan=False, exclude_if=lambda v: v == 1e-5,
                            description="the epsilon of every norm of the hidden width and of the query/key norms "
                                        "(Hugging Face's rms_norm_eps: Llama 3 1e-5, Qwen and OLMo 2 1e-6); numerics "
                                        "only, no cost")
    position: Literal["learned", "rotary", "none"] = "learned"
    tied_embeddings: bool = True
    bias: bool = Field(default=True, description="linear layers carry biases (GPT-2/3, BERT)")
    qkv_bias: bool = Field(default=False, description="only the query/key/value projections carry biases "
                                                      "(Qwen2); implied by bias")
    qk_norm: bool = Field(default=False, description="an RMSNorm over each head's query and key before the "
                                                     "rotary, one weight of d for all heads (Qwen3)")
    qk_norm_scope: Literal["head", "projection"] = Field(
        default="head", exclude_if=lambda v: v == "head",
        description="with qk_norm: head, one RMSNorm of d over each head (Qwen3); projection, one over the whole query "
                    "projection (a d weights) and one over the key projection (k d) (OLMo 2, OLMoE)")
    post_norm: bool = Field(default=False, exclude_if=lambda v: not v,
                            description="a layer's two norms on the attention's and the MLP's outputs, before each "
                                        "residual add, none on their inputs (OLMo 2's reordered norm)")
    attention_sinks: bool = Field(default=False, exclude_if=lambda v: not v,
                                  description="a learned logit per query head in every softmax's denominator, "
                                              "attended by no value (gpt-oss's sinks; Megatron-Core's --softmax-type "
                                              "learnable)")
    sandwich_norm: bool = Field(default=False, description="a norm on the attention's and the MLP's output too, "
                                                            "before each residual add: four per layer (Gemma 2)")
    attention_softcap: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                            description="attention scores soft-capped, cap tanh(x / cap), before "
                                                        "the softmax (Gemma 2: 50)")
    logit_softcap: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                        description="final logits soft-capped, cap tanh(x / cap) (Gemma 2: 30)")
    embedding_scale: bool = Field(default=False, description="token embeddings multiplied by sqrt(hidden) (Gemma)")
    sliding_window: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["seq"],
                                       description="each query attends to the last sliding_window tokens, itself "
                                                   "included (Mistral 7B: 4096; Gemma 2: 4096); None: all before it")
    rope_local_theta: float | None = Field(default=None, gt=0, allow_inf_nan=False,
                                           description="the rotary base of the sliding-window layers where it is "
                                                       "their own (Gemma 3: 10000; its global layers rope_theta 1e6)")
    global_every: int | None = Field(default=None, ge=2, le=SHAPE_LIMITS["layers"],
                                     description="with sliding_window: layers n-1, 2n-1, ... attend to the whole "
                                                 "sequence, the others within the window (Gemma 2: 2); None: every "
                                                 "layer within it")
    experts: int | None = Field(default=None, ge=2, le=SHAPE_LIMITS["experts"],
                                description="mixture of experts: routed experts per layer (Mixtral: 8; Qwen3-30B-A3B: "
                                            "128); None: a dense MLP")
    experts_per_token: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["experts"],
                                          description="experts each token is routed to, top-k (Mixtral: 2; Qwen3 MoE: "
                                                      "8); with experts")
    expert_ffn_hidden: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["ffn_hidden"],
                                          description="each expert's MLP width (Qwen3 MoE's moe_intermediate_size); "
                                                      "default: ffn_hidden")
    normalize_topk: bool = Field(default=True, description="the k chosen experts' softmax weights renormalised to sum "
                                                           "to one (Mixtral; Qwen3 MoE's norm_topk_prob)")
    router_score: Literal["softmax", "sigmoid"] = Field(
        default="softmax", exclude_if=lambda v: v == "softmax",
        description="the router's scores: softmax over the experts (Mixtral, Qwen, DeepSeek-V2) or each expert's "
                    "sigmoid (DeepSeek-V3's scoring_func)")
    router_groups: int | None = Field(
        default=None, ge=2, le=SHAPE_LIMITS["experts"], exclude_if=lambda v: v is None,
        description="group-limited routing: the experts in this many groups, a token's top-k taken within its "
                    "router_group_topk best groups (DeepSeek-V2/V3's n_group)")
    router_group_topk: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["experts"],
                                          exclude_if=lambda v: v is None,
                                          description="with router_groups: the groups a token may use (topk_group)")
    router_bias: bool = Field(default=False, exclude_if=lambda v: not v,
                              description="a per-expert bias added to the scores for the choice only, not a trained "
                                          "parameter (DeepSeek-V3's e_score_correction_bias, noaux_tc)")
    routed_scaling: float = Field(default=1.0, gt=0, allow_inf_nan=False, exclude_if=lambda v: v == 1.0,
                                  description="the k chosen weights multiplied by it (DeepSeek's "
                                              "routed_scaling_factor: V3 2.5)")
    shared_expert_ffn_hidden: int | None = Field(
        default=None, gt=0, le=SHAPE_LIMITS["ffn_hidden"], exclude_if=lambda v: v is None,
        description="a shared expert beside the routed ones, run by every token: an MLP of the dense form and this "
                    "width (Qwen2 MoE's shared_expert_intermediate_size; DeepSeek-V2/V3: n_shared_experts x "
                    "moe_intermediate_size); with experts")
    shared_expert_gate: bool = Field(default=False, exclude_if=lambda v: not v,
                                     description="the shared expert's output scaled by sigmoid(x w), w of hidden "
                                                 "(Qwen2 MoE; Megatron-Core's --moe-shared-expert-gate)")
    dense_layers: tuple[int, ...] = Field(
        default=(), exclude_if=lambda v: not v, max_length=SHAPE_LIMITS["layers"],
        description="with experts: the transformer layers (0-based) whose MLP is dense, ffn_hidden wide, not a "
                    "mixture of experts (Qwen3 MoE's mlp_only_layers; DeepSeek-V3's first three)")
    kv_lora_rank: int | None = Field(
        default=None, gt=0, le=SHAPE_LIMITS["hidden"], exclude_if=lambda v: v is None,
        description="multi-head latent attention (DeepSeek-V2/V3): keys and values from a latent of this width "
                    "(kv_lora_rank: 512); None: the projections of standard attention")
    q_lora_rank: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["hidden"], exclude_if=lambda v: v is None,
                                    description="with kv_lora_rank: queries through a latent of this width too "
                                                "(DeepSeek-V3: 1536); None: projected directly (V2-Lite)")
    qk_rope_head_dim: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["head_dim"],
                                         exclude_if=lambda v: v is None,
                                         description="with kv_lora_rank: of each head's head_dim query/key "
                                                     "dimensions, those rotated, the key's shared by every head (64)")
    v_head_dim: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["head_dim"], exclude_if=lambda v: v is None,
                                   description="with kv_lora_rank: each head's value width (128); default head_dim")
    rotary_dim: int | None = Field(default=None, gt=0, le=SHAPE_LIMITS["head_dim"], exclude_if=lambda v: v is None,
                                   description="with rotary positions: the first rotary_dim dimensions of each "
                                               "head's query and key are rotated, the rest pass through "
                                               "(partial_rotary_factor times head_dim: GLM-4.5's 64 of 128, "
                                               "Phi-4-mini's 96 of 128); None: all of them")
    nope_layers: tuple[int, ...] = Field(
        default=(), exclude_if=lambda v: not v, max_length=SHAPE_LIMITS["layers"],
        description="with rotary positions: the transformer layers (0-based) without them, attending by content "
                    "alone (Llama 4's and SmolLM3's NoPE layers: no_rope_layers 0, every fourth; Megatron-Core's "
                    "--no-rope-freq)")
    rope_interleaved: bool = Field(default=False, exclude_if=lambda v: not v,
                                   description="rotary positions turn adjacent pairs (x_2i, x_2i+1) of each head, "
                                               "not rotate-half's (x_i, x_i+d/2) (Llama 4, Meta's reference code; "
                                               "Megatron-Core's --rotary-interleaved); numerics only, no cost")
    qk_l2_norm: bool = Field(default=False, exclude_if=lambda v: not v,
                             description="each head's query and key divided by its root mean square, no weight, "
                                         "after the rotary, on the layers with rotary positions only (Llama 4's "
                                         "use_qk_norm; Megatron-Core's --qk-l2-norm)")
    attention_chunk: int | None = Field(
        default=None, gt=0, le=SHAPE_LIMITS["seq"], exclude_if=lambda v: v is None,
        description="the layers with rotary positions attend within chunks of this many positions, query i to key "
                    "j <= i where i // chunk == j // chunk; the layers without (nope_layers) to the whole sequence "
                    "(Llama 4's attention_chunk_size: 8192)")
    query_temperature: tuple[int, float] | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="(floor, scale): on the layers without rotary positions each query at position m is multiplied "
                    "by 1 + scale ln(1 + floor((m + 1) / floor)) (Llama 4's attn_temperature_tuning with floor_scale "
                    "8192 and attn_scale 0.1: 1 below position 8191)")
    router_weights_on_input: bool = Field(
        default=False, exclude_if=lambda v: not v,
        description="with experts: each token's input to an expert multiplied by its routing weight, the experts' "
                    "outputs summed unweighted (Llama 4's Llama4TextMoe; Megatron-Core's --moe-apply-probs-on-input)")
    rope_theta: float = Field(default=10000.0, gt=0, allow_inf_nan=False,
                              description="rotary base (RoFormer's 10000; Llama 3: 5e5)")
    vocab: int = Field(gt=0, le=SHAPE_LIMITS["vocab"])
    seq: int = Field(gt=0, le=SHAPE_LIMITS["seq"], description="sequence length trained with")
    source: str = Field(default="", description="where the figures come from")

    @model_validator(mode="after")
    def _defaults(self) -> ModelSpec:
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}) "
                                 "unless head_dim is given")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.heads % self.kv_heads:  # type: ignore[operator]
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if (self.experts is None) != (self.experts_per_token is None):
            raise ValueError("experts and experts_per_token: give both (a mixture of experts) or neither (a dense MLP)")
        if self.experts is not None and self.experts_per_token > self.experts:  # type: ignore[operator]
            raise ValueError(f"experts_per_token ({self.experts_per_token}) must be at most experts ({self.experts})")
        if self.experts is None and self.expert_ffn_hidden is not None:
            raise ValueError("expert_ffn_hidden: only with experts (a mixture of experts)")
        if self.experts is not None and self.expert_ffn_hidden is None:
            object.__setattr__(self, "expert_ffn_hidden", self.f)
        if self.experts is None:
            given = self.given("shared_expert_ffn_hidden", "dense_layers")
            if given:
                raise ValueError(f"{', '.join(given)}: only with experts (a mixture of experts)")
        if self.experts is None:
            routing = self.given("router_score", "router_groups", "router_bias", "routed_scaling")
            if routing:
                raise ValueError(f"{', '.join(routing)}: only with experts (a mixture of experts)")
        if (self.router_groups is None) != (self.router_group_topk is None):
            raise ValueError("router_groups and router_group_topk: give both (group-limited routing) or neither")
        if self.router_groups is not None:
            E, k = int(self.experts or 0), int(self.experts_per_token or 0)
            if E % self.router_groups:
                raise ValueError(f"router_groups: {self.router_groups} does not divide the {E} experts")
            if int(self.router_group_topk or 0) > self.router_groups:
                raise ValueError(f"router_group_topk: {self.router_group_topk} is more than the {self.router_groups} "
                                 "groups")
            if int(self.router_group_topk or 0) * (E // self.router_groups) < k:
                raise ValueError(f"router_group_topk: {self.router_group_topk} groups of {E // self.router_groups} "
                                 f"experts hold fewer than the {k} a token is routed to")
        if self.router_bias and self.router_score != "sigmoid":
            raise ValueError("router_bias: only with router_score sigmoid (DeepSeek-V3's noaux_tc)")
        self._latent()
        if self.shared_expert_gate and self.shared_expert_ffn_hidden is None:
            raise ValueError("shared_expert_gate: only with a shared expert (shared_expert_ffn_hidden)")
        self._layer_list("dense_layers", "every layer is dense; a model without a mixture of experts leaves experts "
                                         "out")
        if not self.gated_mlp:
            glu = self.given("glu_linear_offset", "glu_clamp")
            if glu:
                raise ValueError(f"{', '.join(glu)}: only with a gated MLP (gated_mlp)")
        if self.rotary_dim is not None:
            if self.position != "rotary" or self.mla:
                raise ValueError("rotary_dim: only with rotary positions and standard attention (latent attention "
                                 "rotates its qk_rope_head_dim)")
            if self.rotary_dim > self.d or self.rotary_dim % 2:
                raise ValueError(f"rotary_dim: {self.rotary_dim} must be even and at most head_dim ({self.d}): "
                                 "rotary positions turn pairs of a head's dimensions")
        if self.qk_norm_scope != "head" and not self.qk_norm:
            raise ValueError("qk_norm_scope: only with qk_norm")
        if self.post_norm and self.sandwich_norm:
            raise ValueError("post_norm: not with sandwich_norm (which norms each branch's input and output; "
                             "post_norm its output only)")
        self._llama4()
        if self.global_every is not None and self.sliding_window is None:
            raise ValueError("global_every: only with a sliding_window (the layers between the global ones attend "
                             "within it)")
        return self

    def given(self, *names: str) -> list[str]:
        """Those of the fields ``names`` set to other than their defaults (in that order): what a rule that needs
        something else names."""
        fields = type(self).model_fields
        return [n for n in names if getattr(self, n) != fields[n].default]

    def _layer_list(self, name: str, every: str) -> None:
        """A field listing transformer layers (``dense_layers``, ``nope_layers``): each a layer, none twice, not every
        layer (``every`` says why), kept sorted."""
        listed: tuple[int, ...] = getattr(self, name)
        if not listed:
            return
        wrong = [i for i in listed if not 0 <= i < self.layers]
        if wrong:
            raise ValueError(f"{name}: {wrong[0]} is not a transformer layer (0 to {self.layers - 1})")
        if len(set(listed)) != len(listed):
            raise ValueError(f"{name}: a layer is listed twice")
        if len(listed) == self.layers:
            raise ValueError(f"{name}: {every}")
        object.__setattr__(self, name, tuple(sorted(listed)))

    def _llama4(self) -> None:
        """The rules of Llama 4's attention and routing fields (transformers' ``Llama4TextAttention``,
        ``Llama4TextMoe``): each needs what it acts on."""
        rotary = self.position == "rotary"
        given = self.given("nope_layers", "rope_interleaved", "qk_l2_norm", "attention_chunk")
        if given and (not rotary or self.mla):
            raise ValueError(f"{', '.join(given)}: only with rotary positions and standard attention (position "
                             "rotary, no kv_lora_rank)")
        self._layer_list("nope_layers", "every layer is without rotary positions; a model without them has position "
                                        "none")
        if self.qk_l2_norm and self.qk_norm:
            raise ValueError("qk_l2_norm: not with qk_norm (the weighted norm of each head's query and key)")
        if self.attention_chunk is not None and self.sliding_window is not None:
            raise ValueError("attention_chunk: not with a sliding_window (one limit on the keys a query sees)")
        if self.query_temperature is not None:
            floor, scale = self.query_temperature
            if not self.nope_layers:
                raise ValueError("query_temperature: only with nope_layers (it scales their queries)")
            if floor <= 0 or not math.isfinite(scale) or scale < 0:
                raise ValueError(f"query_temperature: (floor, scale) a positive whole floor and a finite scale of 0 "
                                 f"or more, got ({floor}, {scale})")
        if self.router_weights_on_input and self.experts is None:
            raise ValueError("router_weights_on_input: only with experts (a mixture of experts)")

    def _latent(self) -> None:
        """The rules of multi-head latent attention (DeepSeek-V2, section 2.1; transformers' ``DeepseekV3Attention``):
        ``head_dim`` is the query/key width per head (``qk_nope_head_dim + qk_rope_head_dim``), of which
        ``qk_rope_head_dim`` are rotated; every head has its own key and value (``kv_heads`` = ``heads``); no bias."""
        mla = {"q_lora_rank": self.q_lora_rank, "qk_rope_head_dim": self.qk_rope_head_dim,
               "v_head_dim": self.v_head_dim}
        if self.kv_lora_rank is None:
            given = [name for name, v in mla.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only with kv_lora_rank (multi-head latent attention)")
            return
        if self.qk_rope_head_dim is None:
            raise ValueError("qk_rope_head_dim: multi-head latent attention (kv_lora_rank) needs the rotated part of "
                             "each head")
        if self.qk_rope_head_dim >= self.d:
            raise ValueError(f"qk_rope_head_dim: {self.qk_rope_head_dim} must be less than head_dim ({self.d}): the "
                             "rest of each head's query and key comes from the latent")
        if self.k != self.heads:
            raise ValueError(f"kv_heads: multi-head latent attention gives every head its key and value (kv_heads = "
                             f"heads = {self.heads}), got {self.k}")
        if self.bias or self.qkv_bias:
            raise ValueError("bias, qkv_bias: multi-head latent attention is planned without biases (DeepSeek's "
                             "attention_bias false)")
        if self.attention_sinks:
            raise ValueError("attention_sinks: not planned with multi-head latent attention")
        if self.qk_norm:
            raise ValueError("qk_norm: multi-head latent attention normalises its latents, not each head's query and "
                             "key (Megatron-Core's --qk-layernorm is then the latents' norms)")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim: {self.qk_rope_head_dim} must be even (rotary positions turn pairs "
                             "of dimensions)")
        if self.position != "rotary" or self.encoder:
            raise ValueError("kv_lora_rank: multi-head latent attention in a decoder with rotary positions only")
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.d)

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank`` given)."""
        return self.kv_lora_rank is not None

    @property
    def v_d(self) -> int:
        """Each head's value width: ``v_head_dim`` with latent attention, else ``head_dim``."""
        return int(self.v_head_dim) if self.v_head_dim is not None else self.d

    def replicated_attention_params(self) -> int:
        """Of :meth:`attention_params`, those every tensor-parallel rank holds whole: latent attention's down-
        projections and latent norms (Megatron-Core's duplicated ``linear_q_down_proj``, ``linear_kv_down_proj``,
        ``q_layernorm``, ``kv_layernorm``: :mod:`planner.mla`); 0 for standard attention."""
        if not self.mla:
            return 0
        c, r, h = int(self.kv_lora_rank or 0), int(self.qk_rope_head_dim or 0), self.hidden
        q = h * self.q_lora_rank + self.q_lora_rank if self.q_lora_rank is not None else 0
        return q + h * (c + r) + c

    @property
    def latent_width(self) -> int | None:
        """With latent attention, the width its column-parallel up-projections read (:mod:`planner.mla`): the query
        latent (or ``h`` without one), the key/value latent and the shared rotated key; None otherwise."""
        if not self.mla:
            return None
        return int(self.q_lora_rank or self.hidden) + int(self.kv_lora_rank or 0) + int(self.qk_rope_head_dim or 0)

    @property
    def rot_d(self) -> int:
        """The dimensions of each head's query and key the rotary positions turn: ``rotary_dim``, else ``head_dim``
        (0 without rotary positions; latent attention's are its own, :mod:`planner.mla`)."""
        if self.position != "rotary":
            return 0
        return int(self.rotary_dim) if self.rotary_dim is not None else self.d

    @property
    def o_dim(self) -> int:
        """Width of the attention's output (the output projection's input): ``a`` heads of ``v_d``."""
        return self.heads * self.v_d

    # ---- derived sizes (all resolved by the validator) ----------------------------------------
    @property
    def d(self) -> int:
        return int(self.head_dim)  # type: ignore[arg-type]

    @property
    def k(self) -> int:
        return int(self.kv_heads)  # type: ignore[arg-type]

    @property
    def f(self) -> int:
        return int(self.ffn_hidden)  # type: ignore[arg-type]

    @property
    def moe(self) -> bool:
        """Whether the MLP is a mixture of experts (``experts`` given)."""
        return self.experts is not None

    @property
    def f_e(self) -> int:
        """Each expert's MLP width (``expert_ffn_hidden``); the dense MLP's ``f`` without experts."""
        return int(self.expert_ffn_hidden) if self.expert_ffn_hidden is not None else self.f

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): ``a d``."""
        return self.heads * self.d

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): ``k d``."""
        return self.k * self.d

    @property
    def encoder(self) -> bool:
        return self.architecture == "encoder"

    def attention_params(self) -> int:
        h = self.hidden
        if self.mla:  # (DeepSeek-V2, section 2.1: the down-projections and latent norms, the up-projections)
            r, c, a = int(self.qk_rope_head_dim or 0), int(self.kv_lora_rank or 0), self.heads
            q_up = self.q_lora_rank * self.q_dim if self.q_lora_rank is not None else h * self.q_dim
            return self.replicated_attention_params() + q_up + c * a * (self.d - r + self.v_d) + self.o_dim * h
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + (self.heads if self.attention_sinks else 0)
        if self.bias:
            return weights + self.q_dim + 2 * self.kv_dim + h
        return weights + ((self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0)

    def _mlp_of(self, f: int) -> int:
        """One MLP of the model's form (gated or not, with biases or not) of width ``f``: with biases the up
        projection's ``f`` (the gate and up's ``2f`` gated: Megatron-Core's ``linear_fc1`` of ``2f``, gpt-oss's
        ``gate_up_proj_bias``) and the down projection's ``h``."""
        h = self.hidden
        up = 2 * f if self.gated_mlp else f
        return (3 if self.gated_mlp else 2) * h * f + ((up + h) if self.bias else 0)

    def expert_params(self) -> int:
        """One MLP of width ``f_e`` (an expert's; the dense MLP's without experts)."""
        return self._mlp_of(self.f_e)

    def shared_expert_params(self) -> int:
        """The shared expert (an MLP of width ``shared_expert_ffn_hidden``) and its gate's ``h``; 0 without one."""
        if self.shared_expert_ffn_hidden is None:
            return 0
        return self._mlp_of(self.shared_expert_ffn_hidden) + (self.hidden if self.shared_expert_gate else 0)

    def moe_layer(self, i: int) -> bool:
        """Whether transformer layer ``i`` (0-based)'s MLP is a mixture of experts: every layer of a model with
        experts but its ``dense_layers``."""
        return self.experts is not None and i not in self.dense_layers

    @property
    def moe_layers(self) -> int:
        """How many transformer layers route to experts."""
        return self.layers - len(self.dense_layers) if self.experts is not None else 0

    def _moe_of(self, moe: bool | None) -> bool:
        if moe and self.experts is None:
            raise ValueError("moe: this model has no experts")
        return self.experts is not None if moe is None else moe

    def mlp_params(self, moe: bool | None = None) -> int:
        """The dense MLP (width ``f``), or of a layer with experts (``moe``; default: whether the model has any)
        ``experts`` expert MLPs, the router's ``h E`` and the shared expert (module docstring)."""
        return self._mlp_with(int(self.experts or 0), moe)

    def active_mlp_params(self, moe: bool | None = None) -> int:
        """The MLP parameters one token runs through: the router, ``experts_per_token`` experts and the shared
        expert (all of a dense MLP)."""
        return self._mlp_with(int(self.experts_per_token or 0), moe)

    def _mlp_with(self, experts: int, moe: bool | None) -> int:
        """The dense MLP, or ``experts`` expert MLPs, the router's ``h E`` and the shared expert."""
        if not self._moe_of(moe):
            return self._mlp_of(self.f)
        E = int(self.experts or 0)
        router = (self.hidden + (1 if self.bias else 0)) * E  # with biases the router's too (gpt-oss)
        return experts * self.expert_params() + router + self.shared_expert_params()

    def norm_params(self) -> int:
        """One norm: ``2h`` (LayerNorm) or ``h`` (RMSNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def local_layer(self, i: int) -> bool:
        """Whether transformer layer ``i`` (0-based) attends within the sliding window: every layer but ``n-1,
        2n-1, ...`` with ``global_every = n`` (Mistral 7B, Jiang et al. 2023, section 2: every layer; Gemma 2,
        section 2: local and global layers alternate; Gemma 3, section 2.1: five local layers to a global one)."""
        return self.sliding_window is not None and not (self.global_every is not None
                                                        and (i + 1) % self.global_every == 0)

    def layer_window(self, i: int) -> int | None:
        """The attention window of transformer layer ``i`` where it limits the attention: a local layer's, shorter
        than the sequence (Beltagy et al. 2020, "Longformer", section 3.1: ``w`` keys per query); else None."""
        w = self.sliding_window
        return w if w is not None and w < self.seq and self.local_layer(i) else None

    def layer_rope_theta(self, i: int) -> float:
        """The rotary base of transformer layer ``i``: ``rope_local_theta`` on a local layer where given."""
        return self.rope_local_theta if self.rope_local_theta is not None and self.local_layer(i) else self.rope_theta

    def rotary_layer(self, i: int) -> bool:
        """Whether transformer layer ``i`` (0-based) has rotary positions: every layer of a rotary model but its
        ``nope_layers`` (Llama 4: layers 3, 7, ...; Yang et al. 2025, "Rope to Nope and Back Again")."""
        return self.position == "rotary" and i not in self.nope_layers

    def layer_chunk(self, i: int) -> int | None:
        """The attention chunk of transformer layer ``i`` where it limits the attention: ``attention_chunk`` on a
        layer with rotary positions, shorter than the sequence (Llama 4's chunked attention); else None."""
        c = self.attention_chunk
        return c if c is not None and c < self.seq and self.rotary_layer(i) else None

    @property
    def norms_per_layer(self) -> int:
        """Norms of the hidden width in one layer: before attention and before the MLP (``post_norm``: after each
        instead), and with ``sandwich_norm`` after each of them too."""
        return 4 if self.sandwich_norm else 2

    def layer_params(self, moe: bool | None = None) -> int:
        """Parameters of one transformer layer (its norms, and the query and key norms with ``qk_norm``); ``moe``:
        a layer with experts or a dense one (default: whether the model has experts)."""
        return (self.attention_params() + self.mlp_params(moe) + self.norms_per_layer * self.norm_params()
                + self.qk_norm_params())

    def qk_norm_params(self) -> int:
        """The query and key norms' weights: ``2d`` per head (one ``d`` weight each, shared by the heads), ``a d + k
        d`` over the whole projections (``qk_norm_scope`` projection), 0 without ``qk_norm``."""
        if not self.qk_norm:
            return 0
        return self.q_dim + self.kv_dim if self.qk_norm_scope == "projection" else 2 * self.d

    def block_params(self, i: int) -> int:
        """Parameters of transformer layer ``i`` (0-based): :meth:`layer_params` of its kind (:meth:`moe_layer`)."""
        return self.layer_params(self.moe_layer(i))

    def embedding_params(self) -> int:
        """Word embedding ``V h`` plus learned positions ``s h``."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.position == "learned" else 0)

    def head_params(self) -> int:
        """Final norm plus the output projection ``V h`` (a copy of the embedding when tied)."""
        return self.norm_params() + self.vocab * self.hidden

    def total_params(self) -> int:
        """Parameters of the model, a tied head counted once."""
        head = self.norm_params() if self.tied_embeddings else self.head_params()
        dense = len(self.dense_layers)
        return (self.embedding_params() + (self.layers - dense) * self.layer_params()
                + dense * self.layer_params(False) + head)

    @property
    def profile_layers(self) -> int:
        """The units a profile lists, the planner cuts into pipeline stages and the executor builds: the
        embedding, the ``layers`` blocks and the head (final norm, LM head and loss) -- ``layers + 2``
        (:func:`planner.analytic.analytic_profile`, ``executor.models.build_layers``)."""
        return self.layers + 2

    def with_(self, **changes: object) -> ModelSpec:
        """A validated copy with some fields changed (e.g. fewer layers for profiling); sizes that were derived
        (``head_dim``, ``kv_heads``, ``ffn_hidden`` left unset) are derived again from the new shape."""
        return type(self).model_validate({**self.model_dump(exclude_unset=True), **changes})


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int, source: str,
         encoder: bool = False) -> ModelSpec:
    return ModelSpec(name=name, architecture="encoder" if encoder else "decoder", layers=layers, hidden=hidden,
                     heads=heads, seq=seq, vocab=vocab, source=source)


#: every named model, defined once (the analytical profiles, the executor's zoo and the API seed read it)
PRESETS: dict[str, ModelSpec] = {m.name: m for m in (
    _gpt("gpt-tiny", 4, 64, 4, 32, 256, "small model for tests and CPU profiling"),
    _gpt("bert-tiny", 4, 64, 4, 32, 256, "small model for tests and CPU profiling", encoder=True),
    _gpt("gpt2-medium", 24, 1024, 16, 1024, 50257, "GPT-2 medium (Radford et al. 2019)"),
    _gpt("gpt2-1.3b", 48, 1536, 16, 632, 50257,
         "Chimera (SC'21) section 4, 'GPT-2 1.3B', sequence 632; its table of shapes is lost from our "
         "transcription: 48 layers (it runs D = 32) of hidden 1536 give 1.36B parameters outside the embedding"),
    _gpt("bert-48", 48, 1024, 16, 128, 30522, "Chimera (SC'21) section 4: Bert-48, sequence 128", encoder=True),
    _gpt("gpt3-175b", 96, 12288, 96, 2048, 51200, "GPT-3 (Brown et al. 2020, Table 2.1); Megatron-LM Table 1"),
    _gpt("hanayo-bert", 64, 2560, 64, 512, 30522,
         "Hanayo (SC'23) section 5; sequence and vocabulary not stated (BERT's 512 / 30522 assumed)", encoder=True),
    _gpt("hanayo-gpt", 128, 1024, 16, 1024, 50257,
         "Hanayo (SC'23) section 5; sequence and vocabulary not stated (1024 / GPT-2's 50257 assumed)"),
)}


def get_model(name: str) -> ModelSpec:
    """A preset by name; the error names the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(sorted(PRESETS))}") from None
