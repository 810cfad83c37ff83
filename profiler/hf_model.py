"""A Hugging Face model built by ``transformers`` from its ``config.json`` with random weights (nothing is
downloaded), as a :class:`profiler.layer_model.LayerModel`: the embedding, the decoder layers, the final norm with
the LM head, in the profile's layer names (``embedding``, ``block.i``, ``head``).

The decoder layers of the supported models (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma 2 and 3, Mixtral,
Qwen2 and Qwen3 MoE, DeepSeek-V2 and V3 where :mod:`profiler.hf_config` reads them, GPT-2) are identical in shape (a
sliding window is not applied: no mask is passed; on the CPU the masked scores cost the same), so only
``measure_layers`` of them are built (``num_hidden_layers`` is lowered before the model is made: the memory of a few
layers, not of the model) and the profile's other blocks reuse the last one measured. A mixture of experts with
dense layers (``ModelSpec.dense_layers``: Qwen2/Qwen3 MoE's ``mlp_only_layers`` and the layers
``decoder_sparse_step`` skips; DeepSeek-V2/V3's first ``first_k_dense_replace``) has two kinds of layer: the first
of each kind is built too where the first ``measure_layers`` lack it (:func:`built_layers`; the lowered model's
``mlp_only_layers`` say which of its layers are dense, ``decoder_sparse_step`` 1, or its ``first_k_dense_replace``
how many of its first layers are: :func:`lowered_config`), and each block reuses the last measured one of its own
kind. Each layer is the library's own module: ``LlamaDecoderLayer`` and its kin are called with the rotary
``position_embeddings`` the model's ``rotary_emb`` makes (computed inside the layer wrapper, as a pipeline stage
would), and no attention mask, so the library's SDPA path applies its causal mask itself.

A mixture-of-experts layer (Mixtral's ``MixtralSparseMoeBlock``, Qwen3 MoE's ``Qwen3MoeSparseMoeBlock``, Qwen2 MoE's
``Qwen2MoeSparseMoeBlock`` with its gated shared expert) runs its experts as the library does by default
(``experts_implementation`` "grouped_mm": one grouped GEMM, ``torch.nn.functional.grouped_mm``, over the tokens
sorted by expert; transformers' ``integrations/moe.py``) and
routes each token with its router of random weights (``initializer_range`` 0.02): the top-k of nearly equal scores,
so the tokens spread about evenly over the experts, not as a trained router sends them (``pipeplan profile`` warns
so); a layer's time depends on how many tokens each expert gets.

Llama 4 (``llama4_text``, and the multimodal ``llama4``'s language model): its layers are of up to four kinds, with
experts or dense (``moe_layers``) and with rotary positions or without (``no_rope_layers`` 0: no rotary, no query/key
norm, the queries' temperature), the first of each built (:func:`layer_kind`); the lowered model's ``moe_layers`` and
``no_rope_layers`` are those of the layers built, by their new numbers. Its chunked attention is not applied (no mask
is passed, as for the windows above). transformers' ``Llama4TextExperts`` runs every expert on every token: one
batched matrix product over all ``E`` experts of the tokens repeated ``E`` times, each scaled by its routing weight
(zero for the experts not chosen: ``Llama4TextMoe.forward``), so its measured time is that of ``E / k`` times the
routed work that the planner's operator model and Megatron-Core's grouped GEMM run (:func:`timing_caveats`, in the
profile's notes); the routing itself does not change it.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.model import ModelSpec
from planner.profile import shape_of
from profiler.hf_config import (
    GPT2_TYPES,
    SUPPORTED,
    HFConfigError,
    Warn,
    language_model,
    spec_from_hf_dict,
    transformers_config,
)
from profiler.layer_model import LayerModel

MAX_DEFAULT_SEQ = 8192


class _Embedding(nn.Module):
    def __init__(self, tok: nn.Module, pos: nn.Module | None) -> None:
        super().__init__()
        self.tok, self.pos = tok, pos

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return x


class _Decoder(nn.Module):
    """One of the library's decoder layers; rotary angles computed here from positions ``0..s-1``."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None, layer_type: str | None = None) -> None:
        super().__init__()
        self.layer, self.rotary, self.layer_type = layer, rotary, layer_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        if self.rotary is not None:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            # Gemma 3's rotary tables are per layer type (its local layers' own base)
            angles = (self.rotary(x, positions) if self.layer_type is None else
                      self.rotary(x, positions, self.layer_type))
            kwargs = {"position_ids": positions, "position_embeddings": angles}
        out = self.layer(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out


class _Head(nn.Module):
    def __init__(self, norm: nn.Module, lm_head: nn.Module, cap: float | None = None) -> None:
        super().__init__()
        self.norm, self.lm_head, self.cap = norm, lm_head, cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(x))
        if self.cap is None:
            return logits
        # Gemma 2's final soft-cap, as Gemma2ForCausalLM.forward runs it (three eager kernels)
        return torch.tanh(logits / self.cap) * self.cap


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


#: model types whose dense layers a config lists in ``mlp_only_layers`` (with ``decoder_sparse_step``; transformers'
#: ``Qwen2MoeDecoderLayer``, ``Qwen3MoeDecoderLayer``)
MLP_ONLY_TYPES = ("qwen2_moe", "qwen3_moe")
#: model types whose dense layers are the first ``first_k_dense_replace`` (transformers' ``DeepseekV2DecoderLayer``,
#: ``DeepseekV3DecoderLayer``: a layer with ``layer_idx >= first_k_dense_replace`` has experts)
FIRST_DENSE_TYPES = ("deepseek_v2", "deepseek_v3")


#: model types whose configs list the layers without rotary positions (``no_rope_layers``: 1 rotary, 0 none;
#: transformers' ``Llama4TextConfig``, ``SmolLM3Config``), set for the lowered model by the layers built
#: (:func:`lowered_config`)
NOPE_TYPES = ("llama4_text", "smollm3")
#: model types whose layers with experts a config lists in ``moe_layers`` (``Llama4TextDecoderLayer``)
MOE_LAYERS_TYPES = ("llama4_text",)
#: the experts modules of transformers that run every expert on every token (``Llama4TextExperts``: a batched
#: matrix product over all the experts, the routing weights zeroing the outputs of those not chosen)
DENSE_EXPERTS = ("Llama4TextExperts",)


def layer_kind(spec: ModelSpec, i: int) -> tuple[bool, bool]:
    """The kind of decoder layer ``i``: (with experts, with rotary positions) -- :meth:`ModelSpec.moe_layer` and
    :meth:`ModelSpec.rotary_layer` (Llama 4's NoPE layers have neither the rotary nor the query/key norm, and scale
    their queries); layers of one kind are built alike."""
    return spec.moe_layer(i), spec.rotary_layer(i)


def built_layers(spec: ModelSpec, measure_layers: int) -> list[int]:
    """The decoder layers (0-based) built and measured: the first ``measure_layers`` (all, with fewer layers), and
    the first layer of each kind (:func:`layer_kind`: a mixture of experts or dense, rotary positions or none) they
    lack."""
    built = list(range(min(measure_layers, spec.layers)))
    kinds = {layer_kind(spec, i) for i in built}
    for i in range(spec.layers):
        if layer_kind(spec, i) not in kinds:
            built.append(i)
            kinds.add(layer_kind(spec, i))
    return built


def measured_for(spec: ModelSpec, built: list[int]) -> list[int]:
    """Per decoder layer of the model, the position in ``built`` of the layer it takes its numbers from: itself where
    built, else the last built layer of its kind before it."""
    out = []
    for i in range(spec.layers):
        if i in built:
            out.append(built.index(i))
        else:
            out.append(max(j for j, k in enumerate(built) if k < i and layer_kind(spec, k) == layer_kind(spec, i)))
    return out


def repeated_blocks(spec: ModelSpec, measure_layers: int) -> str:
    """Which blocks reuse which measured one, in words (a profile's ``environment["repeated_blocks"]``):
    ``block.1..block.23 reuse block.0``; with dense layers per kind, ``block.2..block.3 (experts) reuse block.0``;
    with layers without rotary positions too, ``block.7 (experts, no rotary) reuses block.3``; ``none: every layer
    measured``."""
    built = built_layers(spec, measure_layers)
    users: dict[int, list[int]] = {}
    for i, j in enumerate(measured_for(spec, built)):
        if built[j] != i:
            users.setdefault(built[j], []).append(i)
    if not users:
        return "none: every layer measured"
    parts = []
    for src, layers in sorted(users.items()):
        contiguous = layers == list(range(layers[0], layers[-1] + 1))
        listed = (f"block.{layers[0]}" if len(layers) == 1 else f"block.{layers[0]}..block.{layers[-1]}" if contiguous
                  else ", ".join(f"block.{i}" for i in layers))
        words = [*(["experts" if spec.moe_layer(src) else "dense"] if spec.dense_layers else []),
                 *(["rotary" if spec.rotary_layer(src) else "no rotary"] if spec.nope_layers else [])]
        kind = f" ({', '.join(words)})" if words else ""
        parts.append(f"{listed}{kind} reuse{'s' if len(layers) == 1 else ''} block.{src}")
    return "; ".join(parts)


def lowered_config(data: dict[str, Any], spec: ModelSpec, chosen: list[int]) -> Any:
    """The ``transformers`` config of the lowered model: ``data`` (a language model's ``config.json``, of ``spec``)
    with the decoder layers ``chosen`` (:func:`built_layers`) only, their ``layer_types`` where listed, and their
    dense layers by their new numbers: Qwen MoE's ``mlp_only_layers`` (``decoder_sparse_step`` 1), DeepSeek's
    ``first_k_dense_replace`` (the dense layers built, first: a prefix of ``chosen``, as the model's are of its
    layers), or Llama 4's ``moe_layers`` (the layers with experts); Llama 4's and SmolLM3's ``no_rope_layers`` too
    (:data:`NOPE_TYPES`)."""
    model_type = data["model_type"]
    fields = {k: v for k, v in data.items() if k != "model_type"}
    layer_key = "n_layer" if model_type in GPT2_TYPES else "num_hidden_layers"
    fields[layer_key] = len(chosen)
    if isinstance(fields.get("layer_types"), list):  # (a config that lists them: those of the layers built)
        fields["layer_types"] = [fields["layer_types"][i] for i in chosen]
    # the lowered model's dense layers: those of the layers built, by their new numbers
    dense = [j for j, i in enumerate(chosen) if not spec.moe_layer(i)]
    if model_type in NOPE_TYPES:  # (always set: transformers' default makes every fourth layer of the lowered model's
        # own numbering NoPE)
        fields["no_rope_layers"] = [int(spec.rotary_layer(i)) for i in chosen]
    if model_type in MOE_LAYERS_TYPES:  # (always set: the file's list names the model's layers)
        fields["moe_layers"] = [j for j, i in enumerate(chosen) if spec.moe_layer(i)]
    elif model_type in FIRST_DENSE_TYPES:  # (always set: transformers' default for DeepSeek-V3 is 3)
        if dense != list(range(len(dense))):  # (not dense layers first: no first_k_dense_replace says it)
            raise HFConfigError("dense_layers", f"{model_type}: dense layers {list(spec.dense_layers)} are not the "
                                "first layers (first_k_dense_replace)")
        fields["first_k_dense_replace"] = len(dense)
    elif spec.dense_layers:
        if model_type in MLP_ONLY_TYPES:
            fields["mlp_only_layers"] = dense
            fields["decoder_sparse_step"] = 1
        else:
            raise HFConfigError("model_type", f"{model_type}: its dense layers cannot be built apart here (only "
                                f"{', '.join(MLP_ONLY_TYPES)}'s mlp_only_layers and "
                                f"{', '.join(FIRST_DENSE_TYPES)}'s first_k_dense_replace)")
    return transformers_config(model_type, fields)


#: model types whose transformers attention refuses SDPA (Gemma 2's soft-cap, gpt-oss's sinks): timed in its eager one
EAGER_ATTENTION = ("gemma2", "gpt_oss")


def hf_layer_model(data: dict[str, Any], name: str, seq: int | None = None, measure_layers: int = 1,
                   seed: int = 0) -> tuple[LayerModel, ModelSpec]:
    """Build the model of a parsed ``config.json`` with ``measure_layers`` decoder layers; its
    :class:`LayerModel` (all ``num_hidden_layers`` profile layers) and its :class:`ModelSpec`."""
    from transformers import AutoModelForCausalLM

    spec = spec_from_hf_dict(data, name=name, seq=seq)
    if seq is None and spec.seq > MAX_DEFAULT_SEQ:
        raise HFConfigError("max_position_embeddings", f"{spec.seq}: the model supports that long a context, too "
                            f"long to time by default (over {MAX_DEFAULT_SEQ}); give the sequence you train with "
                            "(--seq)")
    if measure_layers < 1:
        raise HFConfigError("layers", f"measure at least one decoder layer, got {measure_layers}")
    chosen = built_layers(spec, measure_layers)  # the model's decoder layers built, in order
    built = len(chosen)
    data = language_model(data)[0]  # (a multimodal config: its language model)
    model_type = data["model_type"]
    assert model_type in SUPPORTED
    cfg = lowered_config(data, spec, chosen)
    # Gemma 2's soft-capped scores and gpt-oss's sinks run in the library's eager attention only (each refuses
    # SDPA): the unfused scores, cap or sinks and softmax, all s x s (without a mask: the same work as the causal one)
    cfg._attn_implementation = "eager" if model_type in EAGER_ATTENTION else "sdpa"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    if model_type in GPT2_TYPES:
        body = model.transformer
        embedding = _Embedding(body.wte, body.wpe)
        decoders = [_Decoder(layer, None) for layer in body.h]
        head = _Head(body.ln_f, model.lm_head)
    else:
        body = model.model
        embedding = _Embedding(body.embed_tokens, None)
        # a rotary embedding per layer type (Gemma 3: the local layers' own base) takes the layer's type
        typed = "layer_type" in inspect.signature(body.rotary_emb.forward).parameters
        decoders = [_Decoder(layer, body.rotary_emb, cfg.layer_types[i] if typed else None)
                    for i, layer in enumerate(body.layers)]
        head = _Head(body.norm, model.lm_head, spec.logit_softcap)
    seq_len, vocab = spec.seq, spec.vocab

    def sample(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 + b)
        window = torch.randint(0, vocab, (b, seq_len + 1), generator=gen)
        return window[:, :-1], window[:, 1:]

    L = spec.layers
    repeat = [0, *[1 + j for j in measured_for(spec, chosen)], built + 1]
    names = ["embedding", *(f"block.{i}" for i in range(L)), "head"]
    kinds = ["embedding", *["transformer"] * L, "lm_head"]
    shape = shape_of(spec)
    tied = {L + 1: spec.vocab * spec.hidden} if spec.tied_embeddings else {}
    # a mixture of experts: each decoder layer's routed experts (planner.expert_parallel splits them; their times at
    # e > 1 are those measured here, the same FLOPs under balanced routing); not the shared expert (every rank keeps
    # it whole), nor a dense layer's MLP
    experts = {1 + i: int(spec.experts) * spec.expert_params() for i in range(L) if spec.moe_layer(i)}
    lm = LayerModel([embedding, *decoders, head], sample, _loss, name=spec.name, names=names, kinds=kinds,
                    repeat=repeat, shape=shape, tied_params=tied, expert_params=experts,
                    replicated_params={1 + i: spec.replicated_attention_params() for i in range(L)
                                       if spec.replicated_attention_params()})
    return lm, spec


def timing_caveats(spec: ModelSpec, lm: LayerModel) -> list[str]:
    """What the layers of ``lm`` (:func:`hf_layer_model` of ``spec``) as timed leave out or add, one sentence each
    (``pipeplan profile --hf-config`` warns of them and keeps them in the profile's notes): a sliding window or an
    attention chunk not applied (no mask is passed: full causal attention); the routing of random weights; experts
    that run every token (:data:`DENSE_EXPERTS`: Llama 4's, ``E / k`` times the routed work)."""
    out = []
    if any(spec.layer_window(i) is not None for i in range(spec.layers)):
        # the layers are timed without a mask: full causal attention everywhere
        out.append(f"hf-config: the layers are timed with full causal attention, not within the model's "
                   f"{spec.sliding_window}-token sliding window (where a kernel skips the positions outside it, those "
                   "layers take less; profile-analytic --attention flash counts that)")
    if any(spec.layer_chunk(i) is not None for i in range(spec.layers)):
        out.append(f"hf-config: the layers are timed with full causal attention, not within the model's "
                   f"{spec.attention_chunk}-token attention chunks (where a kernel skips the positions outside its "
                   "chunk, those layers take less; profile-analytic --attention flash counts that)")
    dense = sorted({type(m).__name__ for layer in lm.layers for m in layer.modules()
                    if type(m).__name__ in DENSE_EXPERTS})
    if spec.moe and dense:
        k = spec.experts_per_token or 1
        out.append(f"hf-config: transformers' {', '.join(dense)} runs every one of the {spec.experts} experts on "
                   f"every token (a batched product over all of them, the routing weights zeroing the others), so the "
                   f"expert layers' measured time is that of {spec.experts / k:g} times the routed work the planner's "
                   "operator model and Megatron-Core's grouped GEMM run (profile-analytic counts the routed work)")
    elif spec.moe:
        # the router of random weights: its top-k spreads tokens about evenly
        out.append(f"hf-config: the {spec.experts}-expert layers are timed with the routing of random weights "
                   "(tokens spread about evenly over the experts), not a trained router's")
    return out


def read_hf_layer_model(path: str | Path, seq: int | None = None, measure_layers: int = 1,
                        name: str | None = None, warn: Warn | None = None) -> tuple[LayerModel, ModelSpec]:
    """:func:`hf_layer_model` of a local ``config.json`` (or a directory holding one); ``warn``: as
    :func:`profiler.hf_config.read_hf_config`'s (a ``seq`` beyond rotary positions' trained length)."""
    from profiler.hf_config import read_hf_config

    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    spec = read_hf_config(p, seq=seq, name=name, warn=warn)  # checks the file, names the field on errors
    return hf_layer_model(json.loads(p.read_text()), spec.name, seq, measure_layers)
