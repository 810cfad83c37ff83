"""Hugging Face ``config.json`` -> :class:`planner.model.ModelSpec`, at the edge (``planner/`` stays free of
transformers).

The file is parsed by ``transformers.AutoConfig.for_model(model_type, **fields)``, which fills in each model type's
defaults exactly as the library does when it loads the model; nothing is downloaded (the JSON is read from the
local file, never from a hub). Field names (Hugging Face ``PretrainedConfig`` attribute names, GPT-2's ``n_*``
names reached through its ``attribute_map``) map to our symbols:

==========================  ===================================  =====================================
ModelSpec                   Llama, Mistral, Qwen2/3, Phi-3,      GPT-2
                            Gemma 1-3 (gemma3_text)
==========================  ===================================  =====================================
``layers``                  ``num_hidden_layers``                ``n_layer``
``hidden``                  ``hidden_size``                      ``n_embd``
``heads``                   ``num_attention_heads``              ``n_head``
``kv_heads``                ``num_key_value_heads``              (= heads)
``head_dim``                ``head_dim`` or hidden / heads       hidden / heads
``ffn_hidden``              ``intermediate_size``                ``n_inner`` or 4 hidden
``vocab``                   ``vocab_size``                       ``vocab_size``
``seq``                     ``max_position_embeddings``          ``n_positions``
``tied_embeddings``         ``tie_word_embeddings``              ``tie_word_embeddings`` (true)
``rope_theta``              ``rope_theta`` (``rope_parameters``)  --
==========================  ===================================  =====================================

Llama-family models have a gated MLP (SwiGLU with ``hidden_act`` silu), RMSNorm and rotary positions; Qwen2 carries
biases on the query/key/value projections only; Qwen3 has none (``attention_bias`` would bias its output projection
too, which no ModelSpec says without MLP biases: refused, :data:`OUTPUT_BIAS_TYPES`) and normalises each head's
query and key (``qk_norm``: ``q_norm``/``k_norm`` in its modeling code); Phi-3 is Llama's computation with the
query/key/value and the gate/up projections stored fused (``qkv_proj``, ``gate_up_proj``: the same parameters), and a
``partial_rotary_factor`` below 1 (Phi-4-mini) rotates the first ``rotary_dim`` of each head; Gemma scales its
embeddings by ``sqrt(hidden)`` (``embedding_scale``) and gates its MLP with GELU's tanh form (``hidden_activation``
gelu_pytorch_tanh: ``gelu_tanh``); Gemma 2 adds a norm on each branch's output (``sandwich_norm``) and soft-caps its
scores and logits (``attn_logit_softcapping`` -> ``attention_softcap``, ``final_logit_softcapping`` ->
``logit_softcap``); Gemma 3's language model (``gemma3_text``) has Gemma 2's norms, Qwen3's per-head query/key norms, no
caps, and local layers with their own rotary base (``rope_local_base_freq`` -> ``rope_local_theta``); GPT-2 has
LayerNorm, learned positions, a GELU MLP and biases. ``seq`` defaults to the longest context the model supports (131072
for Llama 3.1); give the sequence you train with. Mistral's, Phi-3's, Gemma 2's and Gemma 3's sliding windows are the
spec's ``sliding_window`` and ``global_every`` (from the config's ``layer_types`` where it has them); a multimodal
config (Gemma 3, Mistral Small 3.1, LLaVA) is read as its language model (:func:`language_model`); Llama 3.1's
``rope_scaling`` is noted in ``source`` but not modelled; nor is Gemma 2's ``query_pre_attn_scalar`` (the scores' scale,
no cost).

Mixtures of experts (:data:`MOE_TYPES`; ``ModelSpec.experts`` and the fields after it, planner.model's docstring):
Mixtral is Mistral's layer with each MLP replaced by ``num_local_experts`` SwiGLU experts of width
``intermediate_size`` and a router (transformers' ``MixtralConfig`` and ``MixtralSparseMoeBlock``; Jiang et al. 2024,
"Mixtral of Experts", section 2.1), Qwen3 MoE Qwen3's layer (its per-head query/key norms) with ``num_experts``
experts of width ``moe_intermediate_size`` (``Qwen3MoeConfig``, ``Qwen3MoeSparseMoeBlock``; the Qwen3-30B-A3B model
card: 128 experts, 8 activated):

==========================  ===================================  =====================================
ModelSpec                   Mixtral                              Qwen3 MoE (qwen3_moe)
==========================  ===================================  =====================================
``experts``                 ``num_local_experts``                ``num_experts``
``experts_per_token``       ``num_experts_per_tok``              ``num_experts_per_tok``
``expert_ffn_hidden``       ``intermediate_size``                ``moe_intermediate_size``
``ffn_hidden``              ``intermediate_size``                ``intermediate_size`` (dense layers')
``normalize_topk``          (true: ``MixtralTopKRouter``         ``norm_topk_prob`` (transformers'
                            always renormalises the top k)       default false; Qwen3-30B-A3B: true)
==========================  ===================================  =====================================

The expert count, the top-k and Qwen3 MoE's ``moe_intermediate_size`` must be stated, as the shape's other fields
(:data:`REQUIRED`, :data:`MOE_REQUIRED`): transformers' defaults are those of one published model (``MixtralConfig``:
8 experts, top-2, Mixtral 8x7B's; ``Qwen3MoeConfig``: 128, top-8, width 768, Qwen3-30B-A3B's), so a file without
them would be planned as that model, silently; ``norm_topk_prob`` takes transformers' default (false), as the
library does when it loads the file: it changes no shape and no cost to speak of (a division of ``k`` weights per
token). Qwen3 MoE's ``intermediate_size`` stays required, as every Llama-family type's (it is the spec's
``ffn_hidden``): the width of its dense layers, those ``mlp_only_layers`` lists and those ``decoder_sparse_step``
skips (transformers' decoder layer builds the dense MLP where ``layer_idx in mlp_only_layers`` or ``(layer_idx + 1) %
decoder_sparse_step``): ``ModelSpec.dense_layers``. Qwen2 MoE (``qwen2_moe``: Qwen1.5-MoE, Qwen2-57B-A14B) is Qwen3
MoE's routing (``norm_topk_prob``, default false) with Qwen2's attention (``qkv_bias``, default true) and a shared
expert in every layer with experts, ``shared_expert_intermediate_size`` wide, its output always gated by
``sigmoid(shared_expert_gate(x))`` (``Qwen2MoeSparseMoeBlock``): ``shared_expert_ffn_hidden`` and
``shared_expert_gate``; its width must be stated too (transformers' default is Qwen1.5-MoE-A2.7B's 5632).
Mixtral's ``sliding_window`` is Mistral's (every layer; transformers 5's ``MixtralConfig`` defaults it to null and
has no ``layer_types``, Mixtral-8x7B-v0.1 states null); Qwen3 MoE's
applies only with ``use_sliding_window`` (``Qwen3MoeConfig`` nulls it otherwise), on every layer.
``router_aux_loss_coef`` and ``output_router_logits`` (the load-balancing loss) change no cost modelled; a non-zero
Mixtral ``router_jitter_noise`` (a multiplicative noise on the router's input in training) is noted in ``source`` as
not modelled. gpt-oss (``gpt_oss``: :func:`_gpt_oss`) is Mixtral's routing over ``num_local_experts`` experts of
``intermediate_size`` with a sink per attention head, biases on every linear layer, and the clamped quick-GELU gate
(``swiglu_alpha`` 1.702, ``swiglu_limit``); its released weights' ``quantization_config`` (mxfp4), like DeepSeek-V3's
fp8, is noted and not modelled (the plan trains in the profile's dtype). GLM-4.5 (``glm4_moe``) is DeepSeek-V3's
mixture of experts (:func:`_deepseek_moe`) beside grouped-query attention with query/key/value biases
(``attention_bias``), optional per-head query/key norms (``use_qk_norm``) and half of each head rotated
(``partial_rotary_factor``: ``rotary_dim``, as Phi-4-mini's 0.75). OLMo 2, OLMo 3 and OLMoE (:func:`_olmo`) norm
the whole query and key projections (``qk_norm_scope``); OLMo 2 and 3 norm each branch's output, not its input
(``post_norm``).

Llama 4 (``llama4_text``; the multimodal ``llama4``'s ``text_config``: :func:`_llama4`; transformers'
``Llama4TextConfig``, ``Llama4TextAttention``, ``Llama4TextMoe``, ``Llama4Router``; Meta's model cards for
Llama-4-Scout-17B-16E and Llama-4-Maverick-17B-128E): a mixture of ``num_local_experts`` experts of
``intermediate_size`` on the layers ``moe_layers`` lists (transformers derives it from ``interleave_moe_layer_step``:
every layer for Scout, every other one from layer 1 for Maverick), the others dense MLPs of ``intermediate_size_mlp``
(``ffn_hidden``; ``dense_layers``), a shared expert of ``intermediate_size`` beside the routed ones, the top
``num_experts_per_tok`` logits' sigmoids as weights, not renormalised (``router_score`` sigmoid, ``normalize_topk``
false), multiplied into each expert's input (``router_weights_on_input``); no rotary positions on the layers whose
``no_rope_layers`` entry is 0 (``nope_layers``: every fourth), adjacent pairs rotated on the others
(``rope_interleaved``), their queries and keys normed without a weight with ``use_qk_norm`` (``qk_l2_norm``), and
attention within chunks of ``attention_chunk_size`` (``attention_chunk``; the ``layer_types`` transformers derives
are checked to say the same); the NoPE layers' queries scaled by position with ``attn_temperature_tuning``
(``query_temperature``: ``floor_scale``, ``attn_scale``). The shape must be stated (:data:`LLAMA4_REQUIRED`, and
``moe_layers`` or ``interleave_moe_layer_step``): transformers' defaults are Scout's. ``attention_bias`` true is
refused (``Llama4TextAttention`` then biases the output projection too and no MLP: neither ``bias`` nor
``qkv_bias``). Scout's published ``attn_temperature_tuning`` is the whole number 4, which transformers 5's strict
``Llama4TextConfig`` refuses (it declares a bool, and its attention only tests the value's truth): a whole number
there is read as its truth (:data:`FLAGS_AS_INTS`).

SmolLM3 (``smollm3``: :func:`_smollm3`; transformers' ``SmolLM3Config``, ``SmolLM3Attention``; the model card of
HuggingFaceTB/SmolLM3-3B) is Llama's layer -- rotate-half rotary positions, grouped-query attention, a SwiGLU MLP,
RMSNorm, the head tied to the embedding -- with no rotary positions on the layers whose ``no_rope_layers`` entry is 0
(``nope_layers``; ``SmolLM3Config`` derives the list from ``no_rope_layer_interval``, 4 by default: layers 3, 7, ...,
as Llama 4's); nothing else of Llama 4's (no pairs, no query/key norm, no chunks, no temperature).
``SmolLM3Config`` documents a list "with at least the same length as the number of layers": entries past the last
layer are read by nothing and allowed, a shorter list refused naming the field (transformers fails on it). Its window
(``use_sliding_window`` with a ``sliding_window``) goes to the NoPE layers only (``layer_types`` "sliding_attention"
where ``no_rope_layers`` is 0), a pattern ``sliding_window``/``global_every`` cannot say: refused naming
``use_sliding_window`` (SmolLM3-3B has none); ``layer_types`` other than transformers' own reading of those fields is
refused too (its eager mask and its flash kernel would disagree), and ``max_window_layers``, which some published
files carry over from Qwen2's, is read by neither ``SmolLM3Config`` nor its model. ``attention_bias`` biases the
query, key, value and output projections, ``mlp_bias`` the MLP's: one without the other is refused (ModelSpec's

MiniMax-M2 (``minimax_m2``: :func:`_minimax_m2`; transformers' ``MiniMaxM2Config``, ``MiniMaxM2Attention``,
``MiniMaxM2SparseMoeBlock``, ``MiniMaxM2TopKRouter``; the model card of MiniMaxAI/MiniMax-M2) is grouped-query
attention without biases (``head_dim`` 128 with 48 heads over a hidden 3072: ``a d != h``, as GLM-4.5's), one RMSNorm
over the whole query projection and one over the whole key projection before the rotary (OLMo 2's ``qk_norm_scope``
projection; pre-norm), the first ``rotary_dim`` of each head rotated (the legacy field, which ``MiniMaxM2Config``
turns into rope_parameters' ``partial_rotary_factor``: ``rotary_dim``, as GLM-4.5's), and a mixture of
``num_local_experts`` SwiGLU experts of ``intermediate_size`` on every layer, routed as DeepSeek-V3 without groups,
scaling nor a shared expert: sigmoid scores, the top ``num_experts_per_tok`` of the scores plus the per-expert
``e_score_correction_bias`` (``router_bias``, ``use_routing_bias``), the chosen scores renormalised
(``normalize_topk``, always). transformers' defaults are MiniMax-M2's own: the key/value heads and ``head_dim`` must
be stated besides the others (:data:`MINIMAX_REQUIRED`). The published file's own switches, which transformers'
model does not read (it always builds the projection norms, sigmoid routing, no shared expert, full attention, no
biases), are checked to say so, else refused naming the field: ``use_qk_norm``, ``qk_norm_type`` ("per_layer"),
``scoring_func``, ``shared_intermediate_size`` (0), ``attn_type_list`` (1, full attention, on every layer: 0 was
MiniMax-Text-01's lightning attention); ``attention_bias`` and ``mlp_bias`` are ignored, as transformers ignores them
(:data:`OUTPUT_BIAS_TYPES`' note). Its multi-token prediction modules (``use_mtp``, ``num_mtp_modules``) are noted as
not planned (transformers does not build them); its ``mlp_intermediate_size`` is read by nothing.
``bias`` is every linear layer's or none).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner import jsondoc
from planner.limits import MAX_LAYERS, SHAPE_LIMITS
from planner.model import ModelSpec

#: model_type -> family of the mapping above (the mixtures of experts' attention and norms are Mistral's and Qwen3's)
LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "mixtral", "qwen3_moe",
               "qwen2_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "glm4_moe", "olmo2", "olmo3", "olmoe",
               "llama4_text", "smollm3", "minimax_m2")
#: Llama-family types whose MLP is a mixture of experts (every layer's): ModelSpec field -> config.json field
MOE_FIELDS = {
    "mixtral": {"experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                "expert_ffn_hidden": "intermediate_size"},
    "qwen3_moe": {"experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                  "expert_ffn_hidden": "moe_intermediate_size", "normalize_topk": "norm_topk_prob",
                  "dense_layers": "mlp_only_layers"},
    "qwen2_moe": {"experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                  "expert_ffn_hidden": "moe_intermediate_size", "normalize_topk": "norm_topk_prob",
                  "dense_layers": "mlp_only_layers", "shared_expert_ffn_hidden": "shared_expert_intermediate_size"},
    "deepseek_v2": {"experts": "n_routed_experts", "experts_per_token": "num_experts_per_tok",
                    "expert_ffn_hidden": "moe_intermediate_size", "shared_expert_ffn_hidden": "n_shared_experts",
                    "dense_layers": "first_k_dense_replace", "router_groups": "n_group",
                    "router_group_topk": "topk_group", "routed_scaling": "routed_scaling_factor",
                    "kv_lora_rank": "kv_lora_rank", "q_lora_rank": "q_lora_rank",
                    "qk_rope_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim", "bias": "attention_bias"},
}
MOE_FIELDS["deepseek_v3"] = {**MOE_FIELDS["deepseek_v2"], "normalize_topk": "norm_topk_prob"}
MOE_FIELDS["glm4_moe"] = {"experts": "n_routed_experts", "experts_per_token": "num_experts_per_tok",
                          "expert_ffn_hidden": "moe_intermediate_size", "shared_expert_ffn_hidden": "n_shared_experts",
                          "dense_layers": "first_k_dense_replace", "router_groups": "n_group",
                          "router_group_topk": "topk_group", "routed_scaling": "routed_scaling_factor",
                          "normalize_topk": "norm_topk_prob", "qkv_bias": "attention_bias", "qk_norm": "use_qk_norm",
                          "rotary_dim": "partial_rotary_factor"}
#: the fields a GLM-4.5 config.json must state (transformers' defaults are one published model's, GLM-4.5-Air's)
GLM_REQUIRED = ("n_shared_experts", "first_k_dense_replace")
MOE_FIELDS["olmoe"] = {"experts": "num_experts", "experts_per_token": "num_experts_per_tok",
                       "expert_ffn_hidden": "intermediate_size", "normalize_topk": "norm_topk_prob"}
#: OLMo's types: the query and key norms over the whole projections (``qk_norm_scope`` projection); OLMo 2 and 3
#: also norm each branch's output, not its input (``post_norm``); OLMo 3 has sliding windows (``layer_types``)
OLMO_TYPES = ("olmo2", "olmo3", "olmoe")
MOE_FIELDS["gpt_oss"] = {"experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                         "expert_ffn_hidden": "intermediate_size", "bias": "attention_bias",
                         "glu_clamp": "swiglu_limit", "activation": "swiglu_alpha"}
#: gpt-oss's gate, ``gate * sigmoid(alpha * gate)``: ModelSpec's quick_gelu is this alpha (transformers'
#: ``GptOssConfig.swiglu_alpha`` default, the released models')
GPT_OSS_ALPHA = 1.702
#: Llama 4's language model (:func:`_llama4`): ``ffn_hidden`` is the dense layers' width, the routed experts' and the
#: shared expert's is ``intermediate_size`` (``Llama4TextMoe.shared_expert = Llama4TextMLP(config)``)
MOE_FIELDS["llama4_text"] = {"experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                             "expert_ffn_hidden": "intermediate_size", "ffn_hidden": "intermediate_size_mlp",
                             "shared_expert_ffn_hidden": "intermediate_size", "dense_layers": "moe_layers",
                             "nope_layers": "no_rope_layers", "qk_l2_norm": "use_qk_norm",
                             "attention_chunk": "attention_chunk_size", "query_temperature": "attn_temperature_tuning",
                             "bias": "attention_bias"}
#: the fields a Llama 4 config.json (or the multimodal one's text_config) must state besides the others' (its
#: ``num_key_value_heads`` and ``head_dim`` default to Scout's 8 and 128, not to the heads and hidden / heads); one of
#: ``moe_layers`` and ``interleave_moe_layer_step`` too (transformers' default puts experts in every layer)
LLAMA4_REQUIRED = ("num_key_value_heads", "head_dim")
#: MiniMax-M2 (:func:`_minimax_m2`): its experts are intermediate_size wide (every layer's MLP; ffn_hidden, the dense
#: width, is the same field and unused), its partial rotary the legacy rotary_dim
MOE_FIELDS["minimax_m2"] = {"experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                            "expert_ffn_hidden": "intermediate_size", "rotary_dim": "rotary_dim",
                            "router_bias": "use_routing_bias", "router_score": "scoring_func",
                            "qk_norm": "use_qk_norm", "qk_norm_scope": "qk_norm_type"}
#: the fields a MiniMax-M2 config.json must state besides the others' (``MiniMaxM2Config`` defaults its
#: ``num_key_value_heads`` and ``head_dim`` to MiniMax-M2's 8 and 128, not to the heads and hidden / heads)
MINIMAX_REQUIRED = ("num_key_value_heads", "head_dim")
#: boolean fields a published config.json states as a whole number (Llama-4-Scout-17B-16E's ``attn_temperature_tuning``
#: 4), which transformers 5's strict configuration classes refuse: read as its truth, as the modeling code tests it
FLAGS_AS_INTS = {"llama4_text": ("attn_temperature_tuning",)}
#: DeepSeek's types (multi-head latent attention, shared experts, dense first layers: :func:`_deepseek`)
DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3")
#: the fields a DeepSeek config.json must hold (q_lora_rank may be null: V2-Lite's queries have no latent)
DEEPSEEK_REQUIRED = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                     "n_shared_experts", "first_k_dense_replace")
#: mixture-of-experts types whose dense layers are ``mlp_only_layers`` and those ``decoder_sparse_step`` skips
#: (transformers' ``Qwen3MoeDecoderLayer``, ``Qwen2MoeDecoderLayer``)
SPARSE_STEP_TYPES = ("qwen3_moe", "qwen2_moe")
MOE_TYPES = tuple(MOE_FIELDS)
#: the mixture-of-experts fields a config.json must state (module docstring: transformers' defaults are one published
#: model's); Mixtral's expert width is its intermediate_size, already required
MOE_REQUIRED = ("experts", "experts_per_token", "expert_ffn_hidden")
#: Gemma (embeddings times sqrt(h)), Gemma 2 (also: sandwich norms, soft-capped scores and logits, a sliding
#: window on every other layer) and Gemma 3's language model (sandwich norms, Qwen3's per-head query/key norms, a
#: window on five layers of six with their own rotary base): Llama-family otherwise (planner.model's docstring)
GEMMA_TYPES = ("gemma", "gemma2", "gemma3_text")
#: model types whose ``sliding_window`` applies without a ``layer_types`` list saying where (older configs): every
#: layer (Mistral, Phi-3) or every other one from the first (Gemma 2); Qwen2's is off unless ``use_sliding_window``,
#: which transformers then writes into ``layer_types``
#: (Mixtral: Mistral's window, every layer; Qwen3 MoE: every layer, its sliding_window nulled by transformers unless
#: use_sliding_window)
WINDOWED_EVERY = {"mistral": None, "phi3": None, "gemma2": 2, "gemma3_text": 6, "mixtral": None, "qwen3_moe": None}
GPT2_TYPES = ("gpt2",)
SUPPORTED = LLAMA_TYPES + GPT2_TYPES

#: model types refused with the reason (what ModelSpec has no field for), from each one's configuration and modeling
#: code in transformers 5 (none at present: Llama 4, once here, is read)
UNSUPPORTED_WHY: dict[str, str] = {}

#: ModelSpec fields of a Llama-family type without experts -> the config.json field each comes from (errors name it)
TYPE_FIELDS = {"smollm3": {"nope_layers": "no_rope_layers", "bias": "attention_bias"}}

#: types whose ``attention_bias`` biases the output projection as well as the query, key and value (transformers'
#: ``LlamaAttention``, ``Qwen3Attention``, ``GemmaAttention``, ``SmolLM3Attention``, ``Llama4TextAttention``...:
#: ``o_proj`` with ``bias=config.attention_bias``); with ``mlp_bias`` (:data:`MLP_BIAS_TYPES`) every linear layer has
#: one (``ModelSpec.bias``), one without the other no ModelSpec says: refused, naming the one given. GLM-4.5's biases
#: q, k and v only (``qkv_bias``; DeepSeek's latent attention takes none: ModelSpec refuses it)
OUTPUT_BIAS_TYPES = ("llama", "qwen3", "gemma", "gemma2", "gemma3_text", "qwen3_moe", "olmo2", "olmo3", "olmoe",
                     "smollm3", "llama4_text")
#: types whose MLP reads ``mlp_bias`` (``LlamaMLP``, ``SmolLM3MLP``: ``bias=config.mlp_bias``); another type's file's is
#: ignored, as transformers ignores it
MLP_BIAS_TYPES = ("llama", "smollm3")
#: types whose attention reads no ``attention_bias`` (Mistral's, Mixtral's and Phi-3's projections are unbiased, Qwen2's
#: q, k and v always biased, Qwen2 MoE's by its ``qkv_bias``): a file's is ignored, as transformers ignores it
NO_ATTENTION_BIAS = ("mistral", "mixtral", "phi3", "qwen2", "qwen2_moe")

#: ModelSpec field -> the config.json field it comes from (for error messages)
HF_FIELDS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
             "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn_hidden": "intermediate_size",
             "vocab": "vocab_size", "seq": "max_position_embeddings", "rope_theta": "rope_theta",
             "activation": "hidden_act", "norm_eps": "rms_norm_eps"}
GPT2_FIELDS = {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn_hidden": "n_inner",
               "seq": "n_positions", "activation": "activation_function", "norm_eps": "layer_norm_epsilon"}


#: ModelSpec fields bounded as another's (planner.limits.SHAPE_LIMITS)
SHAPE_OF = {"experts_per_token": "experts", "expert_ffn_hidden": "ffn_hidden", "shared_expert_ffn_hidden": "ffn_hidden"}

#: fields a config.json must state (ours; their names above): without them transformers fills in its defaults
#: (a bare {"model_type": "llama"} is Llama 2 7B). Llama-family configs also: intermediate_size, vocab_size
REQUIRED = ("layers", "hidden", "heads")


class HFConfigError(ValueError):
    """A config.json we cannot turn into a ModelSpec; ``field`` names the offending field of the file."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class SeqError(HFConfigError):
    """The sequence asked for (``seq``: the caller's, not a field of the file) is longer than the model's positions
    reach: GPT-2's learned position table has ``n_positions`` rows (a longer sequence grew the table of a model
    that cannot run it). Worded ``seq: ...``; the CLI names its option (``--seq``), the API its field (caught
    before HFConfigError, which they word as the file's); a caller catching only HFConfigError still gets one
    line."""

    def __init__(self, message: str) -> None:
        super().__init__("seq", message)


Warn = Callable[[str], None]
"""Called with one sentence about an input that is taken but doubtful (``seq 1000000 is beyond ...``)."""


def check_seq(cfg: Any, seq: int | None, learned: bool, warn: Warn | None = None) -> str | None:
    """``seq`` against the longest sequence the configuration's positions were trained for (``n_positions``,
    ``max_position_embeddings``): beyond a learned position table a :class:`SeqError`; beyond rotary positions'
    trained length the sentence to warn with (the model extrapolates; the cost is computed the same), also passed
    to ``warn``; else None."""
    trained = getattr(cfg, "max_position_embeddings", None)
    if seq is None or not isinstance(trained, int) or seq <= trained:
        return None
    if learned:
        raise SeqError(f"{seq} is beyond the model's learned positions: its n_positions is {trained} (a "
                       f"position table of {trained} rows); give a sequence of at most {trained}")
    sentence = (f"seq {seq} is beyond max_position_embeddings ({trained}): the model was not trained for so long a "
                "sequence (its rotary positions extrapolate); taken as given")
    if warn is not None:
        warn(sentence)
    return sentence


def _activation(name: str | None, field: str) -> str:
    name = (name or "").lower()
    if name in ("silu", "swish"):
        return "silu"
    if name.startswith("gelu"):
        return "gelu"
    if name == "relu":
        return "relu"
    raise HFConfigError(field, f"activation {name!r} is not one of silu, gelu*, relu")


def _rope_params(cfg: Any, layer_type: str = "full_attention") -> dict[str, Any]:
    """``cfg``'s ``rope_parameters`` (transformers >= 5) for ``layer_type``: the dict itself, or its entry for the
    layer type where it has one per type (Gemma 3: "full_attention", "sliding_attention")."""
    params = getattr(cfg, "rope_parameters", None) or {}
    if not isinstance(params, dict):
        return {}
    typed = params.get(layer_type)
    return typed if isinstance(typed, dict) else params


def _rope_field(cfg: Any, name: str, default: float) -> float:
    """A rotary setting of ``cfg``: its attribute, or (transformers >= 5) its entry in ``rope_parameters`` (the
    global layers' where they are per layer type)."""
    value = getattr(cfg, name, None)
    if value is None:
        value = _rope_params(cfg).get(name)
    if value is None:
        return default
    number = jsondoc.number(value)
    if number is None or number <= 0:
        raise HFConfigError(name, f"a number above 0, got {value!r:.40}")
    return number


def _rope_theta(cfg: Any) -> float:
    return _rope_field(cfg, "rope_theta", 10000.0)


def _rope_local_theta(cfg: Any) -> float | None:
    """The rotary base of the sliding-window layers where it is their own (Gemma 3: ``rope_local_base_freq``
    10000 against the global layers' 1e6; transformers >= 5: ``rope_parameters["sliding_attention"]``)."""
    local = getattr(cfg, "rope_local_base_freq", None)
    if local is None and "sliding_attention" in (getattr(cfg, "rope_parameters", None) or {}):
        local = _rope_params(cfg, "sliding_attention").get("rope_theta")
    if local is None:
        return None
    number = jsondoc.number(local)
    if number is None or number <= 0:
        raise HFConfigError("rope_local_base_freq", f"a number above 0, got {local!r:.40}")
    return number


def _partial_rotary(cfg: Any) -> float:
    """The share of each head the rotary positions turn (Phi-3's and GLM-4.5's ``partial_rotary_factor``; 1
    elsewhere)."""
    return _rope_field(cfg, "partial_rotary_factor", 1.0)


def _rotary_dim(factor: float, head_dim: object) -> int:
    """``ModelSpec.rotary_dim`` of a ``partial_rotary_factor``: ``int(head_dim * factor)``, as transformers' rotary
    embeddings size their table (``Glm4MoeRotaryEmbedding``, ``Phi3RotaryEmbedding``); a factor above 1 or a width
    that is not a whole even number of dimensions is refused, naming the field."""
    d = jsondoc.integer(head_dim) or 0
    dim = int(d * factor)
    if factor > 1 or dim < 2 or dim % 2:
        raise HFConfigError("partial_rotary_factor", f"{factor:g} of the {d} dimensions of a head gives {dim}: rotary "
                                                     "positions turn a whole, even number of them, at most the head")
    return dim


def _norm_eps(cfg: Any, field: str) -> float:
    """The norms' epsilon (``rms_norm_eps``; GPT-2's ``layer_norm_epsilon``), 1e-5 where the config has none; a value
    that is not a number between 0 and 1 is refused naming the field."""
    value = getattr(cfg, field, None)
    if value is None:
        return 1e-5
    number = jsondoc.number(value)
    if number is None or not 0 < number < 1:
        raise HFConfigError(field, f"a number between 0 and 1, got {value!r:.40}")
    return number


def _flag(cfg: Any, field: str, default: bool = False) -> bool:
    """A boolean field of ``cfg`` (``default`` where absent), refused naming the field when not a boolean."""
    value = getattr(cfg, field, default)
    if not isinstance(value, bool):
        raise HFConfigError(field, f"true or false, got {value!r:.40}")
    return value


def parse_hf_config(cfg: Any, name: str, seq: int | None = None, source: str = "",
                    warn: Warn | None = None) -> ModelSpec:
    """A ``transformers.PretrainedConfig`` as a :class:`ModelSpec` (``seq`` overrides the context length; beyond
    the positions' trained length: :func:`check_seq`, its warning in ``source`` too)."""
    model_type = getattr(cfg, "model_type", "")
    if model_type not in SUPPORTED:
        raise HFConfigError("model_type", unsupported_type(model_type))
    fields_of = hf_fields(model_type)
    notes = [source] if source else []
    beyond = check_seq(cfg, seq, learned=model_type in GPT2_TYPES, warn=warn)
    if beyond:
        notes.append(beyond)
    common: dict[str, Any] = dict(
        name=name, architecture="decoder", layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
        heads=cfg.num_attention_heads, vocab=cfg.vocab_size, seq=seq or cfg.max_position_embeddings,
        tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", True)))
    if model_type in GPT2_TYPES:
        spec = dict(common, ffn_hidden=getattr(cfg, "n_inner", None) or 4 * cfg.hidden_size,
                    activation=_activation(getattr(cfg, "activation_function", "gelu"), "activation_function"),
                    norm="layernorm", position="learned", bias=True,
                    norm_eps=_norm_eps(cfg, "layer_norm_epsilon"))
    else:
        attention_bias = _flag(cfg, "attention_bias")
        mlp_bias = model_type in MLP_BIAS_TYPES and _flag(cfg, "mlp_bias")
        if model_type in OUTPUT_BIAS_TYPES and attention_bias != mlp_bias:
            raise HFConfigError("attention_bias" if attention_bias else "mlp_bias", (
                f"true without mlp_bias: transformers' {model_type} attention then biases the query, key, value and "
                "output projections (o_proj, bias=attention_bias) and no MLP" if attention_bias else
                f"true without attention_bias: transformers' {model_type} MLP then biases its projections and no "
                "attention projection") + "; ModelSpec's bias is every linear layer's or none, its qkv_bias the query, "
                "key and value's only")
        spec = dict(common, kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
                    head_dim=_head_dim(cfg, model_type), ffn_hidden=cfg.intermediate_size, gated_mlp=True,
                    activation=_activation(getattr(cfg, "hidden_act", "silu"), "hidden_act"), norm="rmsnorm",
                    position="rotary", bias=attention_bias and mlp_bias,
                    qkv_bias=model_type == "qwen2" or (attention_bias and model_type not in NO_ATTENTION_BIAS)
                    or _qkv_bias(cfg, model_type),
                    rope_theta=_rope_theta(cfg), norm_eps=_norm_eps(cfg, "rms_norm_eps"),
                    qk_norm=model_type in ("qwen3", "gemma3_text", "qwen3_moe"))
        if model_type in MOE_TYPES:
            spec.update(_moe(cfg, model_type, notes))
        if model_type in DEEPSEEK_TYPES:
            spec.update(_deepseek(cfg, model_type, notes))
        if model_type in GEMMA_TYPES:
            _gemma(cfg, model_type, spec)
        if model_type == "gpt_oss":
            spec.update(_gpt_oss(cfg))
        if model_type == "glm4_moe":
            spec.update(_deepseek_moe(cfg, "glm4_moe", notes), qk_norm=_flag(cfg, "use_qk_norm"))
        if model_type in OLMO_TYPES:
            spec.update(_olmo(cfg, model_type))
        if model_type == "llama4_text":
            spec.update(_llama4(cfg))
        if model_type == "smollm3":
            spec.update(_smollm3(cfg))
        if model_type == "minimax_m2":
            spec.update(_minimax_m2(cfg, notes))
        rotary = _partial_rotary(cfg)
        if rotary != 1.0:
            spec["rotary_dim"] = _rotary_dim(rotary, spec.get("head_dim") or cfg.hidden_size // cfg.num_attention_heads)
        spec.update(_window(cfg, model_type))
        scaling = _rope_params(cfg) or getattr(cfg, "rope_scaling", None) or {}
        rope_type = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
        if rope_type != "default":
            notes.append(f"rope_scaling ({rope_type}) not modelled (it changes angles, not cost)")
    quant = getattr(cfg, "quantization_config", None)
    if quant:  # (gpt-oss's mxfp4 experts, DeepSeek-V3's fp8 blocks: how the released weights are stored)
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else getattr(quant, "quant_method", "?")
        notes.append(f"quantization_config ({str(method):.20}) not modelled: planned in the profile's dtype")
    spec["source"] = "; ".join(notes)
    kv = spec.get("kv_heads") or spec["heads"]
    if isinstance(kv, int) and isinstance(spec["heads"], int) and kv > 0 and spec["heads"] % kv:
        raise HFConfigError("num_key_value_heads", f"{kv} does not divide num_attention_heads ({spec['heads']})")
    heads = spec["heads"]
    if not spec.get("head_dim") and isinstance(heads, int) and heads > 0 and spec["hidden"] % heads:
        raise HFConfigError(fields_of["hidden"], f"{spec['hidden']} is not divisible by the {spec['heads']} heads "
                                                 "(and no head_dim is given)")
    try:
        return ModelSpec(**spec)
    except ValidationError as e:
        err = e.errors()[0]
        loc = str(err["loc"][0]) if err["loc"] else "config"
        if not err["loc"]:  # a check across fields (ModelSpec's validator): its message starts with the field it is on
            named = re.match(r"(?:Value error, )?([a-z_]+)[ :,]", err["msg"])
            loc = named.group(1) if named and named.group(1) in fields_of else loc
        raise HFConfigError(fields_of.get(loc, HF_FIELDS.get(loc, loc)), err["msg"]) from None


def hf_fields(model_type: str) -> dict[str, str]:
    """ModelSpec field -> the config.json field it comes from, for ``model_type`` (errors name the file's field):
    :data:`HF_FIELDS`, GPT-2's :data:`GPT2_FIELDS`, and a mixture of experts' :data:`MOE_FIELDS` or another type's
    :data:`TYPE_FIELDS` too."""
    if model_type in GPT2_TYPES:
        return GPT2_FIELDS
    return {**HF_FIELDS, **MOE_FIELDS.get(model_type, {}), **TYPE_FIELDS.get(model_type, {})}


def _head_dim(cfg: Any, model_type: str) -> int | None:
    """Each head's query/key width: ``head_dim`` where the config states it; DeepSeek's ``qk_nope_head_dim +
    qk_rope_head_dim`` (its ``head_dim`` attribute is the rotated part: transformers' ``DeepseekV2Config``)."""
    if model_type in DEEPSEEK_TYPES:
        nope, rope = getattr(cfg, "qk_nope_head_dim", None), getattr(cfg, "qk_rope_head_dim", None)
        for name, value in (("qk_nope_head_dim", nope), ("qk_rope_head_dim", rope)):
            if (jsondoc.integer(value) or 0) < 1:
                raise HFConfigError(name, f"a whole number of 1 or more, got {value!r:.40}")
        return int(nope) + int(rope)
    return getattr(cfg, "head_dim", None)


def _deepseek(cfg: Any, model_type: str, notes: list[str]) -> dict[str, Any]:
    """DeepSeek-V2/V3's fields of ``spec`` as transformers' ``DeepseekV2ForCausalLM`` / ``DeepseekV3ForCausalLM``
    build and run them: multi-head latent attention (``kv_lora_rank``, ``q_lora_rank`` or none, ``qk_rope_head_dim``,
    ``v_head_dim``); ``n_shared_experts`` shared experts of ``moe_intermediate_size``, one MLP of their summed width
    (``DeepseekV3MoE.shared_experts``), not gated; the first ``first_k_dense_replace`` layers dense (``layer_idx >=
    first_k_dense_replace`` routes; ``moe_layer_freq`` is not read by transformers, nor here); the router
    (``DeepseekV2TopkRouter``: softmax scores, ``topk_method`` greedy or group_limited_greedy over ``n_group`` groups
    of which ``topk_group`` are used, no renormalisation whatever ``norm_topk_prob`` says; ``DeepseekV3TopkRouter``:
    sigmoid scores with the choice's bias, groups by the sum of their best two, ``norm_topk_prob``), the weights times
    ``routed_scaling_factor``. V3's multi-token prediction layers (``num_nextn_predict_layers``) are not built by
    transformers: noted, not planned."""
    out: dict[str, Any] = {"kv_lora_rank": getattr(cfg, "kv_lora_rank", None),
                           "q_lora_rank": getattr(cfg, "q_lora_rank", None),
                           "qk_rope_head_dim": getattr(cfg, "qk_rope_head_dim", None),
                           "v_head_dim": getattr(cfg, "v_head_dim", None)}
    return {**out, **_deepseek_moe(cfg, model_type, notes)}


def _deepseek_moe(cfg: Any, model_type: str, notes: list[str]) -> dict[str, Any]:
    """DeepSeek's mixture of experts (:func:`_deepseek`'s docstring), which GLM-4.5 (``glm4_moe``: transformers'
    ``Glm4MoeMoE``, ``Glm4MoeTopkRouter``) runs as DeepSeek-V3's: shared experts, dense first layers, the sigmoid
    router with the choice's bias, its groups, renormalisation and scaling; the multi-token prediction layers
    (``num_nextn_predict_layers``) noted as not planned."""
    out: dict[str, Any] = {}
    shared = getattr(cfg, "n_shared_experts", None) or 0
    width = getattr(cfg, "moe_intermediate_size", None)
    if jsondoc.integer(shared) is None or shared < 0:
        raise HFConfigError("n_shared_experts", f"a whole number of 0 or more, got {shared!r:.40}")
    if shared and isinstance(width, int):
        out["shared_expert_ffn_hidden"] = shared * width
    first = getattr(cfg, "first_k_dense_replace", 0) or 0
    layers = getattr(cfg, "num_hidden_layers", None)
    if jsondoc.integer(first) is None or first < 0:
        raise HFConfigError("first_k_dense_replace", f"a whole number of 0 or more, got {first!r:.40}")
    if isinstance(layers, int) and first >= layers:
        raise HFConfigError("first_k_dense_replace", f"{first}: every one of the {layers} layers would be dense, no "
                                                     "layer routes to the experts")
    out["dense_layers"] = list(range(first))
    scaling = jsondoc.number(getattr(cfg, "routed_scaling_factor", 1.0))
    if scaling is None or scaling <= 0:
        raise HFConfigError("routed_scaling_factor", f"a number above 0, got "
                                                     f"{getattr(cfg, 'routed_scaling_factor', None)!r:.40}")
    out["routed_scaling"] = scaling
    groups, topk_group = getattr(cfg, "n_group", None), getattr(cfg, "topk_group", None)
    if model_type == "deepseek_v2":
        method = getattr(cfg, "topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise HFConfigError("topk_method", f"{method!r:.40}: transformers' DeepseekV2TopkRouter runs greedy or "
                                               "group_limited_greedy")
        out["normalize_topk"] = False  # (DeepseekV2TopkRouter does not renormalise)
        if getattr(cfg, "norm_topk_prob", False):
            notes.append("norm_topk_prob is not applied by transformers' DeepseekV2TopkRouter: the top-k weights are "
                         "taken as they are")
        grouped = method == "group_limited_greedy"
    else:
        out.update(router_score="sigmoid", router_bias=True)
        grouped = True
        mtp = getattr(cfg, "num_nextn_predict_layers", 0) or 0
        if mtp and jsondoc.integer(mtp) is not None:
            notes.append(f"num_nextn_predict_layers ({mtp}): the multi-token prediction layers are not planned "
                         "(transformers does not build them)")
    if grouped and groups not in (None, 1):
        out.update(router_groups=groups, router_group_topk=topk_group)
    return out


def _gpt_oss(cfg: Any) -> dict[str, Any]:
    """gpt-oss's fields of ``spec`` as transformers' ``GptOssForCausalLM`` builds and runs them (planner.model's
    docstring): a sink per head in every attention (``GptOssAttention.sinks``); biases on the attention's projections
    (``attention_bias``), on every expert (``gate_up_proj_bias``, ``down_proj_bias``) and on the router
    (``GptOssTopKRouter.bias``), the last two always -- so a file without attention biases is refused, ModelSpec's
    ``bias`` being all of them or none; the experts' gate ``gate * sigmoid(swiglu_alpha * gate)`` (quick_gelu at
    the released 1.702; another alpha refused) times ``up + 1``, both clamped at ``swiglu_limit``
    (``GptOssExperts._apply_gate``; ``hidden_act`` is not read by the model); the router's softmax over the k largest
    logits (``normalize_topk``)."""
    if not getattr(cfg, "attention_bias", True):
        raise HFConfigError("attention_bias", "false: gpt-oss's experts and router always carry biases "
                                              "(GptOssExperts, GptOssTopKRouter), and a model with biases on those "
                                              "but not on its attention is not planned (ModelSpec's bias is all "
                                              "linear layers or none)")
    alpha = jsondoc.number(getattr(cfg, "swiglu_alpha", GPT_OSS_ALPHA))
    if alpha != GPT_OSS_ALPHA:
        raise HFConfigError("swiglu_alpha", f"{getattr(cfg, 'swiglu_alpha', None)!r:.40}: the gate x sigmoid(alpha x) "
                                            f"is planned at gpt-oss's {GPT_OSS_ALPHA} (quick_gelu) only")
    limit = getattr(cfg, "swiglu_limit", None)
    clamp = jsondoc.number(limit) if limit is not None else None
    if limit is not None and (clamp is None or clamp <= 0):
        raise HFConfigError("swiglu_limit", f"a number above 0 (or null: no clamp), got {limit!r:.40}")
    return {"bias": True, "qkv_bias": False, "attention_sinks": True, "activation": "quick_gelu",
            "glu_linear_offset": 1.0, "glu_clamp": clamp, "normalize_topk": True}


def _olmo(cfg: Any, model_type: str) -> dict[str, Any]:
    """OLMo 2's, OLMo 3's and OLMoE's fields of ``spec`` as transformers builds them (``Olmo2Attention``,
    ``Olmo3Attention``, ``OlmoeAttention``: ``q_norm`` an RMSNorm over the whole query projection, ``a d``, ``k_norm``
    over the key projection, ``k d``, before the rotary: ``qk_norm_scope`` projection; ``Olmo2DecoderLayer``,
    ``Olmo3DecoderLayer``: the attention and the MLP read the residual stream, their outputs normed before each add,
    ``post_norm``; OLMoE's layer is pre-norm). OLMoE's ``clip_qkv`` (the queries, keys and values clamped after the
    norms) is refused where set: not modelled."""
    clip = getattr(cfg, "clip_qkv", None)
    if clip is not None:
        raise HFConfigError("clip_qkv", f"{clip!r:.40}: the clamp of the queries, keys and values is not modelled "
                                        "(null, as OLMoE-1B-7B's, is)")
    return {"qk_norm": True, "qk_norm_scope": "projection", "post_norm": model_type != "olmoe"}


def _llama4(cfg: Any) -> dict[str, Any]:
    """Llama 4's fields of ``spec`` (module docstring) as transformers' ``Llama4ForCausalLM`` builds and runs them:
    ``Llama4TextDecoderLayer`` builds ``Llama4TextMoe`` where ``layer_idx in moe_layers``, else a ``Llama4TextMLP`` of
    ``intermediate_size_mlp``; ``Llama4TextMoe`` adds ``shared_expert = Llama4TextMLP(config)`` (``intermediate_size``)
    to the routed experts; ``Llama4Router`` takes the top ``num_experts_per_tok`` logits and their sigmoids, not
    renormalised (the same weights as the sigmoid's top k: the sigmoid is monotone), and ``Llama4TextMoe.forward``
    multiplies each expert's input by them; ``Llama4TextAttention`` rotates (``apply_rotary_emb``: complex pairs, so
    adjacent dimensions) where ``no_rope_layers[layer_idx]`` is 1, norms the queries and keys there with
    ``Llama4TextWeightlessRMSNorm`` where ``use_qk_norm``, scales the queries of the other layers with
    ``attn_temperature_tuning`` (``floor_scale``, ``attn_scale``); ``Llama4TextModel`` masks each layer by its
    ``layer_types`` entry, "chunked_attention" (``attention_chunk_size``) or "full_attention". What ModelSpec cannot
    say is refused naming the field (``attention_bias``, a bias on q, k, v and o and none on the MLPs, with the other
    types of :data:`OUTPUT_BIAS_TYPES`): a ``no_rope_layers`` not of one 0 or 1 per layer, ``moe_layers`` beyond the
    layers or leaving none with experts, ``layer_types`` other than transformers' own reading of ``no_rope_layers`` and
    ``attention_chunk_size``."""
    layers = cfg.num_hidden_layers
    nope = _nope_layers(cfg)
    moe = getattr(cfg, "moe_layers", None)
    if not isinstance(moe, (list, tuple)) or any(jsondoc.integer(i) is None for i in moe):
        raise HFConfigError("moe_layers", f"a list of layer numbers, got {moe!r:.60}")
    wrong = [i for i in moe if not 0 <= i < layers]
    if wrong:
        raise HFConfigError("moe_layers", f"{wrong[0]} is not a layer of the {layers} (num_hidden_layers)")
    if not moe:
        raise HFConfigError("moe_layers", "empty: every layer would be dense, no layer routes to the experts "
                                          "(interleave_moe_layer_step beyond num_hidden_layers gives none either)")
    chunk = getattr(cfg, "attention_chunk_size", None)
    if chunk is not None and (jsondoc.integer(chunk) or 0) < 1:
        raise HFConfigError("attention_chunk_size", f"a whole number of 1 or more (or null: no chunks), got "
                                                    f"{chunk!r:.40}")
    _layer_types_as(cfg, ["chunked_attention" if i not in nope and chunk is not None else "full_attention"
                          for i in range(layers)],
                    "Llama 4's chunked attention on the layers with rotary positions and full attention on those "
                    "without (no_rope_layers 0) where attention_chunk_size is set, full attention everywhere where it "
                    "is null")
    temperature = None
    if _flag(cfg, "attn_temperature_tuning", True) and nope:
        floor, scale = getattr(cfg, "floor_scale", None), getattr(cfg, "attn_scale", None)
        if (jsondoc.integer(floor) or 0) < 1:
            raise HFConfigError("floor_scale", f"a whole number of 1 or more (the positions per step of the query "
                                               f"temperature), got {floor!r:.40}")
        number = jsondoc.number(scale)
        if number is None or number < 0:
            raise HFConfigError("attn_scale", f"a number of 0 or more, got {scale!r:.40}")
        temperature = (int(floor), number)
    return {"ffn_hidden": cfg.intermediate_size_mlp, "shared_expert_ffn_hidden": cfg.intermediate_size,
            "router_score": "sigmoid", "normalize_topk": False, "router_weights_on_input": True,
            "dense_layers": [i for i in range(layers) if i not in moe], "nope_layers": nope,
            "rope_interleaved": True, "qk_l2_norm": _flag(cfg, "use_qk_norm", True), "attention_chunk": chunk,
            "query_temperature": temperature, "bias": False, "qkv_bias": False}


def _nope_layers(cfg: Any, longer: bool = False) -> list[int]:
    """The layers without rotary positions of ``cfg``'s ``no_rope_layers`` (Llama 4's and SmolLM3's, given or derived
    by their configs from ``no_rope_layer_interval``: ``Llama4TextAttention`` and ``SmolLM3Attention`` rotate layer
    ``i``'s queries and keys where ``no_rope_layers[i]`` is 1, not where it is 0): one 0 or 1 per layer, else refused
    naming the field; with ``longer``, entries past the last layer are allowed and unread (``SmolLM3Config``: "at
    least the same length as the number of layers")."""
    layers = cfg.num_hidden_layers
    rope = getattr(cfg, "no_rope_layers", None)
    if not isinstance(rope, (list, tuple)) or len(rope) < layers or (len(rope) > layers and not longer) \
            or any(isinstance(r, bool) or r not in (0, 1) for r in rope):
        each = "at least one entry per layer" if longer else "one entry per layer"
        raise HFConfigError("no_rope_layers", f"{each} ({layers}, num_hidden_layers), 1 for rotary positions and 0 "
                                              f"for none, got {rope!r:.80}")
    return [i for i in range(layers) if rope[i] == 0]


def _no_rope_given(data: dict[str, Any], model_type: str, prefix: str = "") -> None:
    """A config.json's ``no_rope_layers`` and ``no_rope_layer_interval`` where transformers' configuration fails on
    them, refused naming the field first (``prefix``: where they are): a list of another length than
    ``num_hidden_layers`` (Llama 4, whose empty list is the default's; its own check names the ``layer_types`` it
    derives) or a shorter one (SmolLM3: ``SmolLM3Config`` indexes it by layer); an interval that is not a whole number
    of 1 or more where the config derives the list from it (Llama 4's always, SmolLM3's without a list: ``(layer_idx
    + 1) % no_rope_layer_interval``)."""
    rope, layers = data.get("no_rope_layers"), data.get("num_hidden_layers")
    longer = model_type == "smollm3"
    if isinstance(rope, list) and (rope or longer) and isinstance(layers, int) \
            and (len(rope) < layers if longer else len(rope) != layers):
        each = "at least one per layer" if longer else "one per layer"
        raise HFConfigError(prefix + "no_rope_layers", f"{len(rope)} entries for {layers!r:.20} layers "
                                                       f"(num_hidden_layers): {each}, 1 for rotary positions and 0 "
                                                       "for none")
    step = data.get("no_rope_layer_interval")
    if step is not None and (rope is None or not longer) and (jsondoc.integer(step) or 0) < 1:
        raise HFConfigError(prefix + "no_rope_layer_interval", f"a whole number of 1 or more (every n-th layer has no "
                                                               f"rotary positions), got {step!r:.40}")


def _layer_types_as(cfg: Any, expected: list[str], planned_as: str) -> None:
    """``cfg``'s ``layer_types`` (given, or its config's own reading of the other fields) refused naming the field
    where it is not ``expected``, what the reader plans (``planned_as`` says it in words)."""
    types = list(getattr(cfg, "layer_types", None) or expected)
    if types != expected:
        raise HFConfigError("layer_types", f"{types!r:.80}: planned as {planned_as}; given another pattern, not "
                                           "supported")


def _smollm3(cfg: Any) -> dict[str, Any]:
    """SmolLM3's fields of ``spec`` (module docstring) as transformers' ``SmolLM3ForCausalLM`` builds and runs them:
    ``SmolLM3Attention`` rotates (``apply_rotary_pos_emb``, rotate-half) where ``use_rope = no_rope_layers[layer_idx]``
    is 1 and attends by content alone where it is 0 (``nope_layers``); its projections carry ``attention_bias``,
    ``SmolLM3MLP``'s ``mlp_bias``; ``SmolLM3Config`` makes a layer "sliding_attention" where ``use_sliding_window``, a
    ``sliding_window`` and ``no_rope_layers`` 0 meet, and the attention windows it where ``use_sliding_window`` and
    ``layer_types`` say so. Refused naming the field: one bias without the other (:data:`OUTPUT_BIAS_TYPES`), a window
    (on the NoPE layers only), ``layer_types`` other than that reading."""
    layers = cfg.num_hidden_layers
    nope = _nope_layers(cfg, longer=True)
    window = getattr(cfg, "sliding_window", None)
    windowed = _flag(cfg, "use_sliding_window") and window is not None
    _layer_types_as(cfg, ["sliding_attention" if windowed and i in nope else "full_attention" for i in range(layers)],
                    "SmolLM3Config's own reading: a window on the layers without rotary positions (no_rope_layers "
                    "0) where use_sliding_window and a sliding_window are set, full attention elsewhere")
    if windowed and nope:
        raise HFConfigError("use_sliding_window", f"true with sliding_window {window!r:.20}: transformers' "
                            f"SmolLM3Config windows the layers without rotary positions ({nope[0]}, ...: "
                            "no_rope_layers 0) and no other; a window on some layers is planned on all but every "
                            "n-th one (sliding_window, global_every): not supported (SmolLM3-3B has none)")
    return {"nope_layers": nope}


def _minimax_m2_given(data: dict[str, Any]) -> None:
    """A MiniMax-M2 config.json's ``rotary_dim`` where transformers would take it and plan something else, refused
    naming it: ``MiniMaxM2Config.convert_rope_params_to_dict`` divides it by ``head_dim`` into rope_parameters'
    ``partial_rotary_factor`` whatever it is (a string fails there, 0, an odd number or one beyond the head give a
    factor the rotary table cannot be built of); a whole, even number from 2 to ``head_dim`` is read."""
    rotary, d = data.get("rotary_dim"), data.get("head_dim")
    if rotary is None:
        return
    number = jsondoc.integer(rotary)
    if number is None or number < 2 or number % 2:
        raise HFConfigError("rotary_dim", f"a whole, even number of 2 or more (the dimensions of each head rotary "
                                          f"positions turn), got {rotary!r:.40}")
    if jsondoc.integer(d) is not None and number > d:
        raise HFConfigError("rotary_dim", f"{number} is more than the head's dimensions: at most head_dim ({d})")


def _minimax_m2(cfg: Any, notes: list[str]) -> dict[str, Any]:
    """MiniMax-M2's fields of ``spec`` (module docstring) as transformers' ``MiniMaxM2ForCausalLM`` builds and runs
    them: ``MiniMaxM2Attention`` (q, k, v and o without biases; ``q_norm`` a ``MiniMaxM2RMSNorm`` of
    ``num_attention_heads * head_dim`` on ``q_proj(x)``, ``k_norm`` of ``num_key_value_heads * head_dim`` on
    ``k_proj(x)``, before the split into heads and the rotary: ``qk_norm_scope`` projection), ``apply_rotary_pos_emb``
    on each head's first ``int(head_dim * partial_rotary_factor)`` dimensions (``rotary_dim``, read with the others),
    ``MiniMaxM2SparseMoeBlock`` on every layer (no shared expert) with ``MiniMaxM2TopKRouter`` (sigmoid of the router's
    logits; ``topk`` of the sigmoids plus ``e_score_correction_bias``; the chosen sigmoids divided by their sum) and
    the pre-norm ``MiniMaxM2DecoderLayer``. The file's switches transformers does not read are refused naming the
    field where they say another model (``use_qk_norm`` false, a ``qk_norm_type`` other than per_layer, a
    ``scoring_func`` other than sigmoid, a shared expert, an ``attn_type_list`` entry other than 1); a file's
    ``attention_bias`` and ``mlp_bias`` are ignored, as transformers ignores them (no linear layer has a bias);
    ``use_routing_bias`` false drops the bias of the choice (transformers' buffer then stays at its zeros: the same
    function); a ``rotary_dim`` and a ``partial_rotary_factor`` that disagree are refused (transformers keeps the
    factor). The multi-token prediction modules (``use_mtp``, ``num_mtp_modules``) are noted as not planned."""
    if not _flag(cfg, "use_qk_norm", True):
        raise HFConfigError("use_qk_norm", "false: transformers' MiniMaxM2Attention norms the query and key "
                                           "projections whatever it says (q_norm and k_norm, always built); a model "
                                           "without them is not planned as MiniMax-M2")
    scope = getattr(cfg, "qk_norm_type", "per_layer")
    if scope != "per_layer":
        raise HFConfigError("qk_norm_type", f"{scope!r:.40}: transformers' MiniMaxM2Attention norms the whole query "
                                            "and key projections of each layer (per_layer: qk_norm_scope projection) "
                                            "whatever it says")
    score = getattr(cfg, "scoring_func", "sigmoid")
    if score != "sigmoid":
        raise HFConfigError("scoring_func", f"{score!r:.40}: transformers' MiniMaxM2TopKRouter scores each expert by "
                                            "the sigmoid of its logit whatever it says")
    shared = getattr(cfg, "shared_intermediate_size", 0) or 0
    if any(w != 0 for w in (shared if isinstance(shared, (list, tuple)) else [shared])):
        raise HFConfigError("shared_intermediate_size", f"{shared!r:.40}: transformers' MiniMaxM2SparseMoeBlock builds "
                                                        "no shared expert (0, as MiniMax-M2's)")
    types = getattr(cfg, "attn_type_list", None)
    if types is not None and (not isinstance(types, (list, tuple)) or any(
            isinstance(t, bool) or t != 1 for t in types)):
        raise HFConfigError("attn_type_list", f"{types!r:.60}: transformers' MiniMaxM2 runs full attention on every "
                                              "layer (1; 0 is MiniMax-Text-01's lightning attention, not planned)")
    rotary, d = getattr(cfg, "rotary_dim", None), getattr(cfg, "head_dim", None)
    factor = _partial_rotary(cfg)
    if rotary is not None and isinstance(d, int) and int(d * factor) != rotary:
        raise HFConfigError("rotary_dim", f"{rotary} of each head's {d} dimensions, but rope_parameters' "
                                          f"partial_rotary_factor {factor:g} rotates {int(d * factor)} (transformers "
                                          "keeps the factor): give one of the two, or both agreeing")
    modules = getattr(cfg, "num_mtp_modules", 0) or 0
    if _flag(cfg, "use_mtp") and jsondoc.integer(modules):
        notes.append(f"num_mtp_modules ({modules}): the multi-token prediction modules are not planned (transformers "
                     "does not build them)")
    return {"qk_norm": True, "qk_norm_scope": "projection", "post_norm": False, "router_score": "sigmoid",
            "router_bias": _flag(cfg, "use_routing_bias", True), "bias": False, "qkv_bias": False}


def _qkv_bias(cfg: Any, model_type: str) -> bool:
    """Qwen2 MoE's ``qkv_bias`` (``Qwen2MoeAttention``'s q, k and v projections; transformers 5's default true,
    before it always on); False for other types."""
    return model_type == "qwen2_moe" and _flag(cfg, "qkv_bias", True)


def _dense_layers(cfg: Any, layers: object, experts: object) -> list[int]:
    """The layers a Qwen MoE config makes dense (:data:`SPARSE_STEP_TYPES`): transformers' decoder layer builds the
    dense MLP (``intermediate_size`` wide) where ``layer_idx in mlp_only_layers`` or not ``num_experts > 0 and
    (layer_idx + 1) % decoder_sparse_step == 0``."""
    step = getattr(cfg, "decoder_sparse_step", 1)
    if (jsondoc.integer(step) or 0) < 1:
        raise HFConfigError("decoder_sparse_step", f"a whole number of 1 or more, got {step!r:.40}")
    only = getattr(cfg, "mlp_only_layers", None) or []
    if not isinstance(only, (list, tuple)) or any(jsondoc.integer(i) is None for i in only):
        raise HFConfigError("mlp_only_layers", f"a list of layer numbers, got {only!r:.60}")
    if not isinstance(layers, int) or not isinstance(experts, int) or experts <= 0:
        return []  # (the spec names what is wrong with them)
    wrong = [i for i in only if not 0 <= i < layers]
    if wrong:
        raise HFConfigError("mlp_only_layers", f"{wrong[0]} is not a layer of the {layers} (num_hidden_layers)")
    dense = [i for i in range(layers) if i in only or (i + 1) % step]
    if len(dense) == layers:
        raise HFConfigError("mlp_only_layers" if only else "decoder_sparse_step",
                            f"every one of the {layers} layers would be dense (mlp_only_layers {list(only)!r:.60}, "
                            f"decoder_sparse_step {step}): no layer routes to the experts")
    return dense


def _moe(cfg: Any, model_type: str, notes: list[str]) -> dict[str, Any]:
    """The mixture-of-experts fields of ``spec`` (module docstring's second table) for a :data:`MOE_TYPES` config:
    Mixtral's and MiniMax-M2's experts are ``intermediate_size`` wide and their top-k weights always renormalised
    (``MixtralTopKRouter.forward``, ``MiniMaxM2TopKRouter.forward``); Qwen3 MoE's are ``moe_intermediate_size`` wide,
    renormalised with ``norm_topk_prob`` (``Qwen3MoeTopKRouter``), and a layer is dense where ``Qwen3MoeDecoderLayer``
    builds a ``Qwen3MoeMLP`` (``layer_idx in mlp_only_layers`` or ``(layer_idx + 1) % decoder_sparse_step``): refused,
    as a top-k beyond the experts (``torch.topk`` would fail in the model's forward)."""
    names = MOE_FIELDS[model_type]
    experts, top_k = getattr(cfg, names["experts"], None), getattr(cfg, "num_experts_per_tok", None)
    if isinstance(experts, int) and isinstance(top_k, int) and 0 < experts < top_k:
        raise HFConfigError("num_experts_per_tok", f"{top_k} is more than the {experts} experts "
                                                   f"({names['experts']}): a token is routed to k of them")
    normalize = True if model_type in ("mixtral", "minimax_m2") else _flag(cfg, "norm_topk_prob")
    jitter = getattr(cfg, "router_jitter_noise", None) or 0.0
    number = jsondoc.number(jitter)
    if number is None or number < 0:
        raise HFConfigError("router_jitter_noise", f"a number of 0 or more, got {jitter!r:.40}")
    if number > 0:
        notes.append(f"router_jitter_noise ({number:g}) not modelled (a noise multiplied into the router's input in "
                     "training: an elementwise pass)")
    out = {"experts": experts, "experts_per_token": top_k,
           "expert_ffn_hidden": getattr(cfg, names["expert_ffn_hidden"], None), "normalize_topk": normalize}
    if model_type in SPARSE_STEP_TYPES:
        out["dense_layers"] = _dense_layers(cfg, getattr(cfg, "num_hidden_layers", None), experts)
    if model_type == "qwen2_moe":  # a shared expert in every layer with experts, always gated (Qwen2MoeSparseMoeBlock)
        shared = getattr(cfg, "shared_expert_intermediate_size", None)
        if shared:
            out.update(shared_expert_ffn_hidden=shared, shared_expert_gate=True)
    return out


#: multimodal model types whose language model is read from their ``text_config`` (as the type that names:
#: Gemma 3 4B and up -> gemma3_text, Mistral Small 3.1 -> mistral, LLaVA -> llama, Llama 4 -> llama4_text)
TEXT_CONFIGS = ("gemma3", "mistral3", "llava", "llama4")


def language_model(data: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``data`` itself, or for a multimodal config (:data:`TEXT_CONFIGS`) its language model's fields -- the
    ``text_config`` as transformers completes it with its defaults (the published files state only what differs
    from them) -- with the sentence saying what is left out (the vision tower, its projector)."""
    model_type = data.get("model_type")
    if model_type not in TEXT_CONFIGS:
        return data, None
    if not isinstance(data.get("text_config"), dict):
        raise HFConfigError("text_config", f"missing: a multimodal {model_type} config.json holds its language "
                                           "model's fields there")
    if model_type == "llama4":  # (transformers' defaults are Scout's: the shape stated, as a llama4_text file's)
        _llama4_required(data["text_config"], "text_config.")
    fields = _floats_as_floats(model_type, {k: v for k, v in data.items() if k != "model_type"})
    try:
        cfg = auto_config().for_model(model_type, **fields)
    except Exception as e:  # noqa: BLE001 - transformers validates with several exception types
        raise HFConfigError("text_config", f"transformers cannot read it: {' '.join(str(e).split())}") from None
    text = cfg.text_config.to_dict()
    if text.get("model_type") not in SUPPORTED:
        raise HFConfigError("text_config.model_type", f"the language model of this {model_type} config: "
                                                      + unsupported_type(text.get("model_type")))
    return text, (f"hf-config: the language model of the multimodal {model_type} config (its text_config); its "
                  "vision tower and projector are not planned")


def unsupported_type(model_type: object) -> str:
    """The refusal of a ``model_type`` that is not read, naming those that are (and for a model known not to fit
    a ModelSpec, why: :data:`UNSUPPORTED_WHY`)."""
    why = UNSUPPORTED_WHY.get(model_type) if isinstance(model_type, str) else None
    return (f"{model_type!r} is not supported{f' ({why})' if why else ''}; supported: "
            f"{', '.join((*SUPPORTED, *TEXT_CONFIGS))}")


def _window(cfg: Any, model_type: str) -> dict[str, Any]:
    """``sliding_window`` and ``global_every`` of ``cfg`` (:class:`ModelSpec`): from its ``layer_types``
    ("sliding_attention" / "full_attention" per layer, transformers' own reading of the config) where it has them,
    else by model type (:data:`WINDOWED_EVERY`); a pattern other than "every n-th layer global" is refused."""
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if not window or (types is None and model_type not in WINDOWED_EVERY):
        return {}
    if types is None:  # (Gemma 3's own field where it has it)
        every = getattr(cfg, "sliding_window_pattern", None) or WINDOWED_EVERY[model_type]
        return {"sliding_window": window, "global_every": every}
    local = [t == "sliding_attention" for t in types]
    if not any(local):
        return {}
    if all(local):
        return {"sliding_window": window, "global_every": None}
    every = local.index(False) + 1  # the first global layer is layer n - 1
    if local != [(i + 1) % every != 0 for i in range(len(local))]:
        raise HFConfigError("layer_types", "sliding and full attention layers in a pattern other than every n-th "
                            "layer full: not supported")
    return {"sliding_window": window, "global_every": every}


def _gemma(cfg: Any, model_type: str, spec: dict[str, Any]) -> None:
    """Gemma's, Gemma 2's and Gemma 3's fields of ``spec`` (Gemma Team 2024 and 2025, section 2 of each report;
    Gemma 3's per-head query/key norms are set with Qwen3's)."""
    spec["embedding_scale"] = True
    # Gemma names its activation hidden_activation (hidden_act is the legacy field): gelu_pytorch_tanh
    field = "hidden_activation" if getattr(cfg, "hidden_activation", None) else "hidden_act"
    act = getattr(cfg, field, None)
    spec["activation"] = "gelu_tanh" if act == "gelu_pytorch_tanh" else _activation(act, field)
    if model_type == "gemma":
        return
    spec["sandwich_norm"] = True
    if (local := _rope_local_theta(cfg)) is not None and local != spec["rope_theta"]:
        spec["rope_local_theta"] = local
    for field, key in (("attn_logit_softcapping", "attention_softcap"), ("final_logit_softcapping", "logit_softcap")):
        value = getattr(cfg, field, None)
        if value is not None:
            number = jsondoc.number(value)
            if number is None or number <= 0:
                raise HFConfigError(field, f"a number above 0 (or null: no cap), got {value!r:.40}")
            spec[key] = number


_IMPORT = threading.Lock()
_WARMED: list[Any] = []  # AutoConfig, once every supported type's configuration class is loaded


def _floats_as_floats(model_type: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with a whole number given for a field the configuration class declares a float (and not an int)
    as that float: transformers' strict config classes (DeepSeek's) refuse ``0`` for ``attention_dropout``, and a
    config.json's ``0.0`` arrives as ``0`` from a JavaScript client (``JSON.parse`` keeps no difference), the UI's
    upload included; Python's ``json`` would have read it as the float it is. A whole number for a boolean the
    published files state as one (:data:`FLAGS_AS_INTS`: Llama-4-Scout's ``attn_temperature_tuning`` 4) is read as
    its truth."""
    from transformers import CONFIG_MAPPING

    declared: dict[str, str] = {}
    # (the lazy mapping's get() answers None for a class not imported yet: indexed instead)
    for klass in (CONFIG_MAPPING[model_type].__mro__ if model_type in CONFIG_MAPPING else ()):
        for name, hint in getattr(klass, "__annotations__", {}).items():
            declared.setdefault(name, str(hint))
    out = dict(fields)
    for k, v in fields.items():
        if jsondoc.integer(v) is not None and "float" in declared.get(k, "") \
                and "int" not in declared.get(k, ""):
            try:
                out[k] = float(v)
            except OverflowError:
                raise HFConfigError(k, f"{str(v)[:40]}...: a number beyond any float") from None
    for k in FLAGS_AS_INTS.get(model_type, ()):
        if jsondoc.integer(out.get(k)) is not None:
            out[k] = bool(out[k])
    for k, v in out.items():  # a multimodal config's text_config: by its own type's declarations
        if isinstance(v, dict) and isinstance(v.get("model_type"), str):
            out[k] = {**_floats_as_floats(v["model_type"], v), "model_type": v["model_type"]}
    return out


def auto_config() -> Any:
    """``transformers.AutoConfig`` with each supported model type's configuration class loaded (the import of
    transformers, and torch with it: seconds), once, under a lock: transformers is a lazy module, and a thread
    that reaches it while another is still loading it gets "cannot import name 'AutoConfig'" (seen with the
    server's background warm-up and a request at once; two first requests at once likewise)."""
    with _IMPORT:
        if not _WARMED:
            from transformers import AutoConfig

            for model_type in SUPPORTED:
                AutoConfig.for_model(model_type)
            _WARMED.append(AutoConfig)
        return _WARMED[0]


def warm() -> None:
    """What the first :func:`spec_from_hf_dict` would otherwise spend (:func:`auto_config`): ``pipeplan serve``
    calls it in a background thread once the API listens (api/cli.py)."""
    auto_config()


def default_name(data: dict[str, Any], params: int) -> str:
    """A name for a config.json that carries none (no ``_name_or_path``, no file name to go by, as an upload
    through the API): its ``model_type`` and parameter count, e.g. ``llama-8.0b``, ``gpt2-355m``."""
    size = f"{params / 1e9:.1f}b" if params >= 1e9 else f"{params / 1e6:.0f}m"
    return f"{data.get('model_type') or 'hf-model'}-{size}"


def spec_from_hf_dict(data: dict[str, Any], name: str = "hf-model", seq: int | None = None,
                      source: str = "", warn: Warn | None = None) -> ModelSpec:
    """The parsed JSON of a config.json as a :class:`ModelSpec` (through ``transformers.AutoConfig``); a ``seq``
    beyond the model's positions: :func:`check_seq` (a :class:`SeqError`, or a sentence to ``warn``)."""
    if not isinstance(data, dict):
        raise HFConfigError("config", "expected a JSON object (the contents of config.json)")
    data, left_out = language_model(data)
    if left_out is not None:
        source = "; ".join(filter(None, (source, left_out.removeprefix("hf-config: "))))
        if warn is not None:
            warn(left_out)
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise HFConfigError("model_type", "missing: a config.json names its model_type (e.g. llama)")
    if model_type not in SUPPORTED:
        raise HFConfigError("model_type", unsupported_type(model_type))
    names = hf_fields(model_type)
    required = REQUIRED if model_type in GPT2_TYPES else (*REQUIRED, "ffn_hidden", "vocab")
    moe_required = (*MOE_REQUIRED, *(("shared_expert_ffn_hidden",) if model_type == "qwen2_moe" else ()))
    if model_type == "llama4_text":
        _llama4_required(data)
    if model_type == "smollm3":
        _no_rope_given(data, model_type)
    if model_type == "minimax_m2":
        _minimax_m2_given(data)
    if model_type in (*DEEPSEEK_TYPES, "glm4_moe", "minimax_m2"):
        for theirs in {"glm4_moe": GLM_REQUIRED, "minimax_m2": MINIMAX_REQUIRED}.get(model_type, DEEPSEEK_REQUIRED):
            if theirs not in data:
                raise HFConfigError(theirs, f"missing: the model's shape must be stated (transformers would fill in "
                                            f"its {model_type} default, another model than yours)")
    for ours in (*required, *(moe_required if model_type in MOE_TYPES else ())):
        theirs = names.get(ours, "vocab_size")
        # (Mixtral's num_local_experts may be given by its alias num_experts: MixtralConfig.attribute_map; Llama
        # 4's, whose Llama4TextConfig has no such alias, is checked by _llama4_required)
        given = data.get(theirs, data.get("num_experts") if theirs == "num_local_experts" else None)
        if given is None:
            raise HFConfigError(theirs, f"missing: the model's shape must be stated (transformers would fill in "
                                        f"its {model_type} default, another model than yours)")
    for ours, theirs in names.items():
        value = data.get(theirs)
        # (DeepSeek's n_shared_experts counts experts, 0 for none; _deepseek checks it)
        limit = SHAPE_LIMITS.get(SHAPE_OF.get(ours, ours)) if theirs != "n_shared_experts" else None
        if limit is not None and value is not None:
            if (jsondoc.integer(value) or 0) < 1:
                raise HFConfigError(theirs, f"must be a positive integer, got {value!r}")
            if value > limit:
                why = (f" transformer layers: a profile holds at most {MAX_LAYERS} layers, the blocks, the embedding "
                       "and the head" if ours == "layers" else "")
                raise HFConfigError(theirs, f"{value} is beyond any published model (at most {limit}{why})")
    return parse_hf_config(transformers_config(model_type, data), name, seq, source, warn)


def _llama4_required(data: dict[str, Any], prefix: str = "") -> None:
    """The fields a Llama 4 language model's config must state (the module docstring: transformers' defaults are
    Scout's): those every Llama-family file must, its mixture of experts' (:data:`MOE_FIELDS`), :data:`LLAMA4_REQUIRED`,
    and ``moe_layers`` or ``interleave_moe_layer_step`` (a whole number of 1 or more); a ``no_rope_layers`` list of
    another length than ``num_hidden_layers`` or a ``no_rope_layer_interval`` below 1 is refused here, naming it
    (:func:`_no_rope_given`). ``prefix`` names where they are (``text_config.`` in a multimodal config)."""
    if not isinstance(data, dict):
        raise HFConfigError(prefix.rstrip(".") or "config", "expected a JSON object")
    names = hf_fields("llama4_text")
    wanted = [names[ours] for ours in (*REQUIRED, "ffn_hidden", "vocab", *MOE_REQUIRED)]
    for theirs in (*wanted, *LLAMA4_REQUIRED):
        if data.get(theirs) is None:
            raise HFConfigError(prefix + theirs, "missing: the model's shape must be stated (transformers would fill "
                                                 "in its llama4_text default, Llama 4 Scout's, another model than "
                                                 "yours)")
    _no_rope_given(data, "llama4_text", prefix)
    step = data.get("interleave_moe_layer_step")
    if data.get("moe_layers") is None:
        if step is None:
            raise HFConfigError(prefix + "interleave_moe_layer_step", "missing (and no moe_layers): which layers hold "
                                "the experts must be stated (transformers would put them in every layer, as Scout)")
        if (jsondoc.integer(step) or 0) < 1:
            raise HFConfigError(prefix + "interleave_moe_layer_step", f"a whole number of 1 or more (every n-th layer "
                                                                      f"has experts), got {step!r:.40}")


def transformers_config(model_type: str, data: dict[str, Any]) -> Any:
    """``data`` (a config.json's fields) as transformers' configuration of ``model_type``, its defaults filled in; a
    file it refuses is an :class:`HFConfigError` naming the field where transformers names one. Whole numbers for the
    float fields are taken (:func:`_floats_as_floats`)."""
    AutoConfig = auto_config()
    fields = _floats_as_floats(model_type, {k: v for k, v in data.items() if k != "model_type"})
    try:
        return AutoConfig.for_model(model_type, **fields)
    except Exception as e:  # noqa: BLE001 - transformers validates with several exception types
        # its validators wrap the reason ("Class validation error for validator 'validate_architecture':
        # ValueError: The hidden size (4096) is not a multiple of ..."): the reason is what the user can act on
        text = " ".join(str(e).split())
        reason = re.search(r"(?:ValueError|TypeError): (.+)$", text)
        # its type checks name the field ("Validation error for field 'qkv_bias': TypeError: Field 'qkv_bias'
        # expected bool, got str"): the error names it too
        typed = re.search(r"[Ee]rror for field '([A-Za-z_][A-Za-z0-9_]*)'", text)
        raise HFConfigError(str(getattr(e, "field", None) or (typed.group(1) if typed else "config")),
                            f"transformers cannot read it: {reason.group(1) if reason else text}") from None


DROPOUT_FIELDS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout")


def trains_with_dropout(data: dict[str, Any]) -> bool:
    """Whether the configuration trains with dropout (GPT-2: 0.1; Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma: 0), the
    library's defaults filled in; the operator model then counts the dropout masks
    (planner.operators.OperatorOptions)."""
    data = language_model(data)[0]
    model_type = data.get("model_type")
    if model_type not in SUPPORTED:
        raise HFConfigError("model_type", unsupported_type(model_type))
    cfg = transformers_config(model_type, data)
    rates = {f: float(getattr(cfg, f, 0.0) or 0.0) for f in DROPOUT_FIELDS}
    for f, p in rates.items():  # (NaN read as "no dropout", inf as "dropout"; a probability is neither)
        if not 0.0 <= p <= 1.0:
            raise HFConfigError(f, f"a dropout probability in [0, 1], got {p}")
    return any(p > 0 for p in rates.values())


def read_hf_json(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` at ``path`` (or in the directory ``path``)."""
    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    try:
        return json.loads(p.read_text())
    except OSError as e:
        raise HFConfigError("path", f"cannot read {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise HFConfigError("config", f"{p} is not a text file (UTF-8)") from None
    except json.JSONDecodeError as e:
        raise HFConfigError("config", f"{p} is not JSON: {e}") from None
    except RecursionError:
        raise HFConfigError("config", f"{p} is nested too deep to be a config.json") from None


def read_hf_config(path: str | Path, seq: int | None = None, name: str | None = None,
                   warn: Warn | None = None) -> ModelSpec:
    """Read a local ``config.json`` (or a directory holding one); the name defaults to the directory's name
    (``examples/models/llama-3.1-8b/config.json`` -> ``llama-3.1-8b``) or the file's stem."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    data = read_hf_json(p)
    default = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return spec_from_hf_dict(data, name or default, seq, source=f"Hugging Face config {p}", warn=warn)
