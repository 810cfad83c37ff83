"""The executor's view of a model: :class:`planner.model.ModelSpec` plus what only training needs (dropout).

There is one registry of named models, :data:`planner.model.PRESETS` (sources of every preset there);
:data:`PRESETS` here is the same models as :class:`ModelConfig`, nothing is defined twice. A model read from a
Hugging Face ``config.json`` (:mod:`profiler.hf_config`) is a ``ModelSpec`` too, and :func:`get_config` takes
one as it is.

The family picks the zoo's layer code (:func:`family_of`):

* ``gpt``: decoder, LayerNorm, learned positions, GELU MLP (nanoGPT / GPT-2; :mod:`executor.models.gpt`);
* ``bert``: the same blocks bidirectional, masked-LM head (:mod:`executor.models.bert`);
* ``llama``: decoder with rotary positions (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 1-3: RMSNorm, GQA,
  SwiGLU, untied head; Qwen3's per-head query/key norms; Gemma 2's norms on each branch's output and soft-caps;
  with ``experts``, a sparse mixture-of-experts MLP: Mixtral, Jiang et al. 2024, "Mixtral of Experts", section
  2.1, and Qwen3 MoE as transformers' ``Qwen3MoeSparseMoeBlock`` computes it, top-k routing with or without the
  renormalisation; Qwen2 MoE's shared expert, gated or not, and dense layers, as transformers'
  ``Qwen2MoeSparseMoeBlock`` and ``Qwen2MoeDecoderLayer``; DeepSeek-V2/V3's routing (sigmoid scores, group-limited
  choice, the choice's bias, the weights' scaling) and multi-head latent attention (``kv_lora_rank``,
  :mod:`executor.models.mla`; ModelSpec refuses ``qk_norm`` with it); gpt-oss's attention sinks, clamped
  ``quick_gelu`` gate with its offset and biases on every linear layer, the router's too, as transformers'
  ``GptOssForCausalLM``; GLM-4.5's (``Glm4MoeForCausalLM``) DeepSeek-V3 routing beside query/key/value biases, q/k
  norms and partial rotary, ``rotary_dim`` of each head rotated, Phi-4-mini's too; OLMo 2's, OLMo 3's and OLMoE's
  query/key norms over the whole projections (``qk_norm_scope``) and OLMo 2's norms on each branch's output
  (``post_norm``), as transformers' ``Olmo2ForCausalLM``, ``Olmo3ForCausalLM``, ``OlmoeForCausalLM``; Llama 4's
  NoPE layers, rotary on adjacent pairs, weightless query/key norms, chunked attention, query temperature and
  routing weights on the experts' inputs (``nope_layers``, ``rope_interleaved``, ``qk_l2_norm``, ``attention_chunk``,
  ``query_temperature``, ``router_weights_on_input``), as transformers' ``Llama4ForCausalLM``;
  :mod:`executor.models.llama`). A
  mixture of experts and latent attention are built in this family only (``ModelSpec`` allows latent attention in a
  rotary decoder only).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from planner.model import PRESETS as SPECS
from planner.model import ModelSpec

Family = Literal["gpt", "bert", "llama"]


def family_of(spec: ModelSpec) -> Family:
    """The zoo family that builds ``spec``; a shape none of them builds is refused naming the field."""
    llama4 = spec.given("nope_layers", "rope_interleaved", "qk_l2_norm", "attention_chunk", "query_temperature",
                        "router_weights_on_input")
    if llama4 and (spec.encoder or spec.position != "rotary"):  # (ModelSpec refuses most of them without rotary)
        raise ValueError(f"{', '.join(llama4)}: the zoo builds these (Llama 4's) in its Llama-family (rotary) decoder "
                         f"only, not with architecture={spec.architecture!r}, position={spec.position!r}")
    if spec.experts is not None and (spec.encoder or spec.position != "rotary"):
        raise ValueError("experts: the zoo builds a mixture of experts in its Llama-family (rotary) decoder only, not "
                         f"with architecture={spec.architecture!r}, position={spec.position!r}")
    if spec.position != "rotary":  # Gemma's and gpt-oss's pieces are in the Llama-family code only
        gemma = [name for name, on in (("sandwich_norm", spec.sandwich_norm),
                                       ("attention_softcap", spec.attention_softcap is not None),
                                       ("logit_softcap", spec.logit_softcap is not None),
                                       ("embedding_scale", spec.embedding_scale),
                                       ("activation", spec.activation == "gelu_tanh")) if on]
        if gemma:
            raise ValueError(f"{', '.join(gemma)}: the zoo builds these (Gemma's) in its Llama-family (rotary) "
                             f"decoder only, not with position={spec.position!r}")
        oss = [name for name, on in (("attention_sinks", spec.attention_sinks),
                                     ("activation", spec.activation == "quick_gelu")) if on]
        if oss:  # (glu_linear_offset and glu_clamp need a gated MLP, which only the Llama family builds)
            raise ValueError(f"{', '.join(oss)}: the zoo builds these (gpt-oss's) in its Llama-family (rotary) "
                             f"decoder only, not with position={spec.position!r}")
        norms = [name for name, on in (("qk_norm", spec.qk_norm), ("post_norm", spec.post_norm)) if on]
        if norms:  # (qk_norm_scope needs qk_norm)
            raise ValueError(f"{', '.join(norms)}: the zoo builds the query/key norms (Qwen3's per head, OLMo's "
                             "over the projections) and OLMo 2's reordered norm in its Llama-family (rotary) decoder "
                             f"only, not with position={spec.position!r}")
    if spec.encoder:
        if spec.position != "learned" or spec.gated_mlp or spec.norm != "layernorm":
            raise ValueError("encoder models: the zoo builds BERT only (learned positions, LayerNorm, GELU MLP)")
        return "bert"
    if spec.position == "rotary":
        return "llama"
    if spec.position == "learned" and not spec.gated_mlp and spec.norm == "layernorm":
        if spec.kv_heads != spec.heads or spec.d * spec.heads != spec.hidden:
            raise ValueError("GPT family (learned positions): kv_heads must equal heads and head_dim hidden/heads")
        return "gpt"
    raise ValueError(f"position={spec.position!r} with norm={spec.norm!r} and gated_mlp={spec.gated_mlp}: the zoo "
                     "builds GPT (learned positions, LayerNorm, GELU MLP) or Llama-family (rotary) decoders")


class ModelConfig(ModelSpec):
    """A :class:`ModelSpec` the executor can build, with the training-only ``dropout``."""

    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)

    @classmethod
    def from_spec(cls, spec: ModelSpec, **changes: Any) -> ModelConfig:
        return cls.model_validate({**spec.model_dump(exclude_unset=True), **changes})

    @property
    def family(self) -> Family:
        return family_of(self)

    @property
    def num_profile_layers(self) -> int:
        """Layers of :func:`executor.models.build_layers`: embedding, the blocks, the head with the loss."""
        return self.profile_layers

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def spec(self) -> ModelSpec:
        """The plain model description (without ``dropout``)."""
        return ModelSpec.model_validate(self.model_dump(exclude={"dropout"}, exclude_unset=True))


#: the presets of :data:`planner.model.PRESETS`, as executor configs (one registry)
PRESETS: dict[str, ModelConfig] = {name: ModelConfig.from_spec(spec) for name, spec in SPECS.items()}


def get_config(name_or_config: str | ModelSpec) -> ModelConfig:
    """A preset by name (see :data:`PRESETS`), or the given spec as a :class:`ModelConfig`."""
    if isinstance(name_or_config, ModelConfig):
        return name_or_config
    if isinstance(name_or_config, ModelSpec):
        return ModelConfig.from_spec(name_or_config)
    try:
        return PRESETS[name_or_config]
    except KeyError:
        raise ValueError(f"unknown model {name_or_config!r}; presets: {', '.join(sorted(PRESETS))}") from None
