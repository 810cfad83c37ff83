"""The zoo's Llama family (executor/models/llama.py): shapes, parameter counts, stages, and the same function as
the Hugging Face implementation (transformers' LlamaForCausalLM) given the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from executor.expert_parallel import ExpertParallelMoE
from executor.models import Stage, build_layers, get_config, layer_kinds, tied_parameters
from executor.models.analytic import layer_params, model_params
from executor.models.blocks import Block
from executor.models.data import synthetic_batch
from executor.models.llama import LlamaBlock
from executor.tensor_parallel import TensorParallelBlock, TensorParallelLlamaBlock
from profiler.hf_config import read_hf_config

torch.set_num_threads(1)
TINY = Path(__file__).resolve().parent / "fixtures" / "tiny-llama" / "config.json"


def tiny(**changes: object):  # noqa: ANN201
    return get_config(read_hf_config(TINY, name="tiny-llama").with_(**changes))


def test_family_shapes_and_counts() -> None:
    cfg = tiny()
    assert cfg.family == "llama"
    layers = build_layers(cfg, seed=1)
    assert layer_kinds(cfg) == ["embedding", *["transformer"] * 6, "lm_head"]
    assert [sum(p.numel() for p in m.parameters()) for m in layers] == layer_params(cfg)
    assert sum(p.numel() for p in Stage(layers).parameters()) == model_params(cfg) == cfg.total_params()
    block = layers[1]
    assert isinstance(block, LlamaBlock)
    assert block.k.weight.shape == (2 * 16, 64) and block.q.weight.shape == (64, 64)  # GQA: 2 KV heads of 16
    assert block.gate.weight.shape == (128, 64) and block.q.bias is None
    assert tied_parameters(cfg) == []  # untied head
    ids, targets = synthetic_batch(cfg, 3)
    loss = Stage(layers)(ids, targets)
    assert abs(loss.item() - np.log(cfg.vocab)) < 1.0


def test_stages_equal_whole_model() -> None:
    cfg = tiny()
    ids, targets = synthetic_batch(cfg, 2, seed=4)
    whole = Stage(build_layers(cfg, seed=7))(ids, targets)
    x = ids
    for a, b in [(0, 3), (3, 5), (5, 8)]:
        stage = Stage(build_layers(cfg, seed=7, start=a, stop=b))
        x = stage(x, targets) if b == 8 else stage(x)
    torch.testing.assert_close(x, whole)


def _same_logits(cfg, layers, hf, copy_block, tol: float | None = None) -> None:  # type: ignore[no-untyped-def]
    """Copy our embedding, final norm and head into transformers' model ``hf`` and each block with
    ``copy_block(ours, theirs)`` (which copies its projections), then compare the logits of one batch (``tol``: rtol
    and atol where given, else ``assert_close``'s defaults for the dtype)."""
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(layers[0].tok.weight)
        for ours, theirs in zip(layers[1:-1], hf.model.layers, strict=True):
            copy_block(ours, theirs)
            theirs.input_layernorm.weight.copy_(ours.input_norm.weight)
            theirs.post_attention_layernorm.weight.copy_(ours.post_norm.weight)
        hf.model.norm.weight.copy_(layers[-1].norm.weight)
        hf.lm_head.weight.copy_(layers[-1].weight)
        ids, _ = synthetic_batch(cfg, 2, seed=3)
        x = ids
        for m in layers[:-1]:
            x = m(x)
        torch.testing.assert_close(layers[-1].logits(x), hf(ids).logits, rtol=tol, atol=tol)


def _copy_projections(ours, theirs) -> None:  # type: ignore[no-untyped-def]
    at, mlp = theirs.self_attn, theirs.mlp
    for a, b in ((ours.q, at.q_proj), (ours.k, at.k_proj), (ours.v, at.v_proj), (ours.o, at.o_proj),
                 (ours.gate, mlp.gate_proj), (ours.up, mlp.up_proj), (ours.down, mlp.down_proj)):
        b.weight.copy_(a.weight)
        if a.bias is not None:
            b.bias.copy_(a.bias)


@pytest.mark.parametrize("changes", [{}, {"qkv_bias": True, "kv_heads": 4}, {"tied_embeddings": True}])
def test_same_function_as_transformers(changes: dict[str, object]) -> None:
    """Copy our weights into transformers' LlamaForCausalLM (eager attention, float64): same logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = tiny(**changes)
    data = json.loads(TINY.read_text())
    data.update(num_key_value_heads=cfg.k, attention_bias=cfg.qkv_bias, tie_word_embeddings=cfg.tied_embeddings)
    data.pop("model_type")
    hf = LlamaForCausalLM(LlamaConfig(**data, attn_implementation="eager")).double().eval()
    _same_logits(cfg, [m.double().eval() for m in build_layers(cfg, seed=2)], hf, _copy_projections)


def _ours_and_theirs(fixture: str, config_cls, model_cls):  # type: ignore[no-untyped-def]
    """The spec of ``tests/fixtures/<fixture>``, our layers of it and transformers' model of the same file (eager
    attention), both in float64; the same parameter count."""
    path = TINY.parent.parent / fixture / "config.json"
    spec = read_hf_config(path, name=fixture)
    cfg = get_config(spec)
    data = json.loads(path.read_text())
    data.pop("model_type")
    hf = model_cls(config_cls(**data, attn_implementation="eager")).double().eval()
    layers = [m.double().eval() for m in build_layers(cfg, seed=2)]
    assert sum(p.numel() for p in hf.parameters()) == model_params(cfg) == cfg.total_params()
    return spec, cfg, layers, hf


def test_qwen3_same_function_as_transformers() -> None:
    """Qwen3 (per-head query/key RMSNorm, head_dim 32 with h / a = 16, untied head): our weights copied into
    transformers' Qwen3ForCausalLM give the same logits; the parameter count is its own."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec, cfg, layers, hf = _ours_and_theirs("tiny-qwen3", Qwen3Config, Qwen3ForCausalLM)
    assert spec.qk_norm and spec.d == 32 and not spec.qkv_bias

    def copy_block(ours, theirs) -> None:  # type: ignore[no-untyped-def]
        _copy_projections(ours, theirs)
        for norm, target in ((ours.q_norm, theirs.self_attn.q_norm), (ours.k_norm, theirs.self_attn.k_norm)):
            norm.weight.uniform_(0.5, 1.5)  # norms at one would hide a norm applied in the wrong place
            target.weight.copy_(norm.weight)

    _same_logits(cfg, layers, hf, copy_block)


def test_phi3_same_function_as_transformers() -> None:
    """Phi-3 is Llama's computation with fused weights: ours copied into transformers' Phi3ForCausalLM
    (``qkv_proj`` = q, k, v stacked; ``gate_up_proj`` = gate, up) give the same logits and parameter count."""
    from transformers import Phi3Config, Phi3ForCausalLM

    _, cfg, layers, hf = _ours_and_theirs("tiny-phi3", Phi3Config, Phi3ForCausalLM)

    def copy_block(ours, theirs) -> None:  # type: ignore[no-untyped-def]
        theirs.self_attn.qkv_proj.weight.copy_(torch.cat([ours.q.weight, ours.k.weight, ours.v.weight]))
        theirs.self_attn.o_proj.weight.copy_(ours.o.weight)
        theirs.mlp.gate_up_proj.weight.copy_(torch.cat([ours.gate.weight, ours.up.weight]))
        theirs.mlp.down_proj.weight.copy_(ours.down.weight)

    _same_logits(cfg, layers, hf, copy_block)


def _gemma_same_logits(fixture: str, config_cls, model_cls):  # type: ignore[no-untyped-def]
    """Our weights copied into transformers' Gemma 2 / Gemma 3 model built from ``fixture`` (eager attention,
    float64; its RMSNorm scales by 1 + w: ours less one): the same parameter count and logits. Gemma's RMSNorm
    computes in float32 whatever the model's dtype (``x.float()``), hence float32's tolerance; the gates are
    scaled up so that GELU's tanh form and the exact one would differ."""
    spec, cfg, layers, hf = _ours_and_theirs(fixture, config_cls, model_cls)
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(layers[0].tok.weight)
        for ours, theirs in zip(layers[1:-1], hf.model.layers, strict=True):
            ours.gate.weight.mul_(30)  # gate inputs of order 1, where GELU's tanh form and the exact one differ
            _copy_projections(ours, theirs)
            pairs = [(ours.input_norm, theirs.input_layernorm), (ours.attn_out_norm, theirs.post_attention_layernorm),
                     (ours.post_norm, theirs.pre_feedforward_layernorm),
                     (ours.mlp_out_norm, theirs.post_feedforward_layernorm)]
            if ours.q_norm is not None:
                pairs += [(ours.q_norm, theirs.self_attn.q_norm), (ours.k_norm, theirs.self_attn.k_norm)]
            for norm, target in pairs:
                norm.weight.uniform_(0.5, 1.5)  # norms at one would hide a norm applied in the wrong place
                target.weight.copy_(norm.weight - 1)
        hf.model.norm.weight.copy_(layers[-1].norm.weight - 1)
        ids, _ = synthetic_batch(cfg, 2, seed=3)
        x = ids
        for m in layers[:-1]:
            x = m(x)
        torch.testing.assert_close(layers[-1].logits(x), hf(ids).logits, rtol=1e-5, atol=1e-5)
    return spec


def test_gemma2_same_function_as_transformers() -> None:
    """Gemma 2 (embeddings times sqrt(h), a norm on each branch's output, soft-capped scores and logits, GELU's
    tanh form, head_dim 32 with h / a = 16, tied head): the same function as transformers' Gemma2ForCausalLM.
    The caps are small (2 and 3) so that a cap missing or misplaced changes the logits; the window (8 of 16
    positions, on layers 0 and 2) masks as transformers' does; the scores' scale is 1/sqrt(head_dim), as ours."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    spec = _gemma_same_logits("tiny-gemma2", Gemma2Config, Gemma2ForCausalLM)
    assert spec.sandwich_norm and spec.embedding_scale and spec.activation == "gelu_tanh" and not spec.qk_norm
    assert (spec.attention_softcap, spec.logit_softcap, spec.d, spec.tied_embeddings) == (2.0, 3.0, 32, True)
    assert [spec.layer_window(i) for i in range(4)] == [8, None, 8, None]


def test_gemma3_same_function_as_transformers() -> None:
    """Gemma 3's language model (Gemma2's layer with Qwen3's per-head query/key norms and no caps; a window of 8
    on two layers of three, which rotate with their own base, 10 against 1000): the same function as
    transformers' Gemma3ForCausalLM."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    spec = _gemma_same_logits("tiny-gemma3", Gemma3TextConfig, Gemma3ForCausalLM)
    assert spec.qk_norm and spec.sandwich_norm and spec.attention_softcap is None and spec.logit_softcap is None
    assert [spec.layer_window(i) for i in range(6)] == [8, 8, None, 8, 8, None]
    assert [spec.layer_rope_theta(i) for i in range(3)] == [10.0, 10.0, 1000.0]


def test_gemma_pieces_on_a_learned_position_model_are_refused() -> None:
    """The GPT and BERT zoo blocks have no sandwich norms, caps, scale or tanh GELU: such a spec is refused naming
    the fields, not built without them."""
    from executor.models.config import family_of
    from planner.model import PRESETS

    for changes in ({"sandwich_norm": True}, {"logit_softcap": 30.0, "activation": "gelu_tanh"}):
        with pytest.raises(ValueError, match=next(iter(changes))):
            family_of(PRESETS["gpt-tiny"].with_(**changes))
    assert family_of(PRESETS["gpt-tiny"]) == "gpt"


#: every family and norm the zoo builds: GPT's and BERT's LayerNorms, Llama's RMSNorms, Gemma 2's sandwich norms,
#: Qwen3's per-head and OLMo 2's projection-wide query/key norms (split at t = 2), OLMoE's and DeepSeek's experts
#: (e = 2) and DeepSeek's latents
NORM_MODELS = {"gpt2": "tiny-gpt2", "bert": "bert-tiny", "llama": "tiny-llama", "gemma2": "tiny-gemma2",
               "qwen3": "tiny-qwen3", "olmo2": "tiny-olmo2", "olmoe": "tiny-olmoe", "deepseek-v3": "tiny-deepseek-v3"}


@pytest.mark.parametrize("name", NORM_MODELS)
def test_every_norm_takes_the_specs_epsilon(name: str) -> None:
    """Every norm the executor builds (every module whose class is a ``...Norm``: the blocks', the embedding's and
    the head's, the query/key norms) has the spec's ``norm_eps`` (here 3e-6, no model's default), so do the blocks
    split at t = 2 (rank 0 of 2, built without a group: the GPT blocks' and the Llama family's, their split
    query/key norms too) and with their experts split at e = 2; DeepSeek's latent norms keep transformers' fixed
    1e-6 (DeepseekV3RMSNorm's default, not rms_norm_eps)."""
    from planner.model import PRESETS

    source = NORM_MODELS[name]
    base = (PRESETS[source] if source in PRESETS
            else read_hf_config(TINY.parent.parent / source / "config.json", name=source))
    spec = base.with_(norm_eps=3e-6)
    assert base.norm_eps != spec.norm_eps

    def eps(modules: list[torch.nn.Module]) -> dict[str, set[float]]:
        """The norms' epsilons, the latents' apart."""
        found: dict[str, set[float]] = {"norms": set(), "latents": set()}
        for layer in modules:
            for n, m in layer.named_modules():
                if type(m).__name__.endswith("Norm"):
                    found["latents" if n.endswith("_a_layernorm") else "norms"].add(m.eps)
        return found

    layers = build_layers(get_config(spec), seed=1)
    want = {"norms": {3e-6}, "latents": {1e-6} if spec.mla else set()}
    assert eps(layers) == want
    split = [TensorParallelBlock(m, 0, 2, None) if isinstance(m, Block) else TensorParallelLlamaBlock(m, 0, 2, None)
             for m in layers[1:-1]]
    for block in split:
        if getattr(block, "moe", None) is not None:
            block.moe = ExpertParallelMoE(block.moe, 0, 2, None)
    assert eps(split) == want
