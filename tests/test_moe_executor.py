"""The zoo's mixture of experts (executor/models/llama.py's SparseMoE; Mixtral, Jiang et al. 2024, section 2.1;
Qwen3 MoE): the same function as transformers' MixtralForCausalLM and Qwen3MoeForCausalLM given the same weights
(float64), its parameter count ModelSpec's, and its tensor-parallel shard (executor/tensor_parallel.py) the same
output and gradients at t = 2 as the whole block. Pipeline and tensor-parallel training runs of a tiny MoE are in
tests/test_llama_run.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_parity import copy_routed_experts
from run_support import tp_block_errors

from executor.models import Stage, build_layers, get_config
from executor.models.analytic import layer_params, model_params
from executor.models.data import synthetic_batch
from executor.models.llama import LlamaBlock, SparseMoE
from planner.model import PRESETS, ModelSpec
from profiler.hf_config import read_hf_config
from tests.test_llama import _same_logits

torch.set_num_threads(1)
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def mixtral_spec() -> ModelSpec:
    """Tiny Mixtral: tests/fixtures/tiny-llama's shape (hidden 64, 4 heads, 2 KV heads), 2 layers, 4 experts of
    width 128 (its ffn_hidden, as Mixtral's experts are intermediate_size wide), top-2, renormalised."""
    base = read_hf_config(FIXTURES / "tiny-llama" / "config.json", name="tiny-mixtral")
    return base.with_(layers=2, experts=4, experts_per_token=2)


def qwen3_moe_spec(normalize: bool) -> ModelSpec:
    """Tiny Qwen3 MoE: tests/fixtures/tiny-qwen3's shape (query/key norms, head_dim 32), 2 layers, 8 experts of
    width 32, top-2, ``norm_topk_prob`` = ``normalize``."""
    base = read_hf_config(FIXTURES / "tiny-qwen3" / "config.json", name="tiny-qwen3-moe")
    return base.with_(layers=2, experts=8, experts_per_token=2, expert_ffn_hidden=32, normalize_topk=normalize)


def hf_mixtral(spec: ModelSpec):  # type: ignore[no-untyped-def]
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(
        hidden_size=spec.hidden, intermediate_size=spec.f_e, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.k, vocab_size=spec.vocab,
        num_local_experts=spec.experts, num_experts_per_tok=spec.experts_per_token, rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_theta, max_position_embeddings=spec.seq, tie_word_embeddings=spec.tied_embeddings,
        attn_implementation="eager", experts_implementation="eager"))


def hf_qwen3_moe(spec: ModelSpec):  # type: ignore[no-untyped-def]
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM(Qwen3MoeConfig(
        hidden_size=spec.hidden, intermediate_size=spec.f, moe_intermediate_size=spec.f_e,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.k,
        head_dim=spec.d, vocab_size=spec.vocab, num_experts=spec.experts, num_experts_per_tok=spec.experts_per_token,
        norm_topk_prob=spec.normalize_topk, rms_norm_eps=spec.norm_eps, rope_theta=spec.rope_theta,
        max_position_embeddings=spec.seq, tie_word_embeddings=spec.tied_embeddings,
        attn_implementation="eager", experts_implementation="eager"))


CASES = {"mixtral": (mixtral_spec, hf_mixtral),
         "qwen3-moe norm_topk_prob": (lambda: qwen3_moe_spec(True), hf_qwen3_moe),
         "qwen3-moe without norm_topk_prob": (lambda: qwen3_moe_spec(False), hf_qwen3_moe)}


def copy_moe(ours: SparseMoE, theirs: torch.nn.Module) -> None:
    """Our router and experts into transformers 5's sparse MoE block (:func:`hf_parity.copy_routed_experts`)."""
    with torch.no_grad():
        copy_routed_experts(ours, theirs)


def ours_and_theirs(case: str):  # type: ignore[no-untyped-def]
    make_spec, make_hf = CASES[case]
    spec = make_spec()
    cfg = get_config(spec)
    layers = [m.double().eval() for m in build_layers(cfg, seed=2)]
    hf = make_hf(spec).double().eval()
    assert sum(p.numel() for p in hf.parameters()) == model_params(cfg) == cfg.total_params()
    return spec, cfg, layers, hf


@pytest.mark.parametrize("case", list(CASES))
def test_moe_layer_same_function_as_transformers(case: str) -> None:
    """Our SparseMoE against transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock on the same tokens,
    float64, to 1e-12: both take the softmax in float32 on the same logits, so any other placement or dtype of the
    softmax, or a renormalisation done or left out otherwise, shows (float32's rounding is 1e-8)."""
    spec, _, layers, hf = ours_and_theirs(case)
    ours, theirs = layers[1].moe, hf.model.layers[0].mlp
    copy_moe(ours, theirs)
    x = torch.randn(3, 16, spec.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)
    # the routing is not trivial: every expert gets tokens, the top weight of a token is not 1/k
    from executor.models.llama import route

    weights, index = route(ours.router(x.view(-1, spec.hidden)), ours.top_k, ours.normalize, x.dtype)
    assert set(index.unique().tolist()) == set(range(int(spec.experts)))
    assert (weights.max(dim=-1).values - 1 / ours.top_k).abs().max() > 0.1
    if not spec.normalize_topk:
        assert weights.sum(dim=-1).mean() < 0.95  # the k weights do not sum to one


@pytest.mark.parametrize("case", list(CASES))
def test_moe_same_logits_as_transformers(case: str) -> None:
    """The whole model: our weights copied into transformers' model give the same logits (float64; transformers'
    RMSNorm rounds through float32 whatever the dtype, hence float32's tolerance, as for Gemma in
    tests/test_llama.py)."""
    _, cfg, layers, hf = ours_and_theirs(case)

    def copy_block(ours, theirs) -> None:  # type: ignore[no-untyped-def]
        at = theirs.self_attn
        for a, b in ((ours.q, at.q_proj), (ours.k, at.k_proj), (ours.v, at.v_proj), (ours.o, at.o_proj)):
            b.weight.copy_(a.weight)
        pairs = [(ours.input_norm, theirs.input_layernorm), (ours.post_norm, theirs.post_attention_layernorm)]
        if ours.q_norm is not None:
            pairs += [(ours.q_norm, at.q_norm), (ours.k_norm, at.k_norm)]
        for norm, target in pairs:
            norm.weight.uniform_(0.5, 1.5)  # norms at one would hide a norm applied in the wrong place
            target.weight.copy_(norm.weight)
        copy_moe(ours.moe, theirs.mlp)

    _same_logits(cfg, layers, hf, copy_block, tol=1e-5)


def test_moe_shapes_and_parameter_counts() -> None:
    """A block's parameters are ModelSpec.layer_params() (router h E, E experts of 3 h f_e, norms, attention); the
    dense MLP's gate, up and down are absent; a spec with biases and no gate counts as built too, its router biased."""
    for spec in (mixtral_spec(), qwen3_moe_spec(False),
                 mixtral_spec().with_(gated_mlp=False, bias=True, activation="gelu", normalize_topk=False)):
        cfg = get_config(spec)
        assert cfg.family == "llama"
        layers = build_layers(cfg, seed=1)
        assert [sum(p.numel() for p in m.parameters()) for m in layers] == layer_params(cfg)
        assert sum(p.numel() for p in Stage(layers).parameters()) == model_params(cfg) == cfg.total_params()
        block = layers[1]
        assert isinstance(block, LlamaBlock) and block.up is None and block.gate is None and block.down is None
        assert sum(p.numel() for p in block.parameters()) == spec.layer_params()
        assert block.moe.router.weight.shape == (spec.experts, spec.hidden)
        assert (block.moe.router.bias is not None) == spec.bias  # (with biases the router's too, as gpt-oss's)
        assert len(block.moe.experts) == spec.experts
        assert block.moe.experts[0].up.weight.shape == (spec.f_e, spec.hidden)
        assert (block.moe.experts[0].gate is not None) == spec.gated_mlp
        ids, targets = synthetic_batch(cfg, 2)
        assert torch.isfinite(Stage(layers)(ids, targets))


def test_expert_without_tokens_gets_a_zero_gradient() -> None:
    """One token, top-1 of 4 experts: three experts run on no token and get a gradient of zeros, not None (every
    rank and stage then holds the same set of gradients)."""
    moe = build_layers(get_config(mixtral_spec().with_(experts_per_token=1)), seed=1, start=1, stop=2)[0].moe
    moe(torch.randn(1, 1, 64)).sum().backward()
    grads = [e.up.weight.grad for e in moe.experts]
    assert all(g is not None for g in grads)
    assert sorted(bool(g.abs().sum() > 0) for g in grads) == [False, False, False, True]


def test_moe_in_bfloat16_keeps_the_hidden_dtype() -> None:
    """The routing weights, computed in float32, are cast back to the hidden dtype (Qwen3MoeTopKRouter's
    ``.to(router_logits.dtype)``): a bfloat16 block's output is bfloat16, and the float32 routing agrees with it."""
    block = build_layers(get_config(qwen3_moe_spec(False)), seed=1, start=1, stop=2)[0]
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(2))
    want = block.moe(x)
    got = block.to(torch.bfloat16).moe(x.to(torch.bfloat16))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.02)


def test_moe_outside_the_llama_family_is_refused() -> None:
    """The GPT and BERT blocks have no router: a mixture of experts with learned positions is refused naming
    experts, not built dense."""
    from executor.models.config import family_of

    with pytest.raises(ValueError, match="experts"):
        family_of(PRESETS["gpt-tiny"].with_(experts=4, experts_per_token=2))
    assert family_of(mixtral_spec()) == "llama"


def test_tensor_parallel_plan_needs_t_to_divide_the_experts_width() -> None:
    """A run at t = 2 splits each expert's MLP by columns: an expert width t does not divide is refused before
    anything is launched, naming it (the dense ffn_hidden, unused with experts, is not asked to divide)."""
    from executor.plan import PlanError, RunPlan

    def plan(spec: ModelSpec) -> RunPlan:
        return RunPlan.direct("1f1b", 1, 2, tensor=2, model=spec.name, model_spec=spec.model_dump(), iterations=1)

    with pytest.raises(PlanError, match=r"experts' MLP width \(33\)"):
        plan(mixtral_spec().with_(expert_ffn_hidden=33)).validate()
    plan(mixtral_spec().with_(ffn_hidden=33, expert_ffn_hidden=32)).validate()


@pytest.mark.slow
def test_tensor_parallel_moe_equals_whole_block() -> None:
    """t = 2 (gloo, two processes) against the whole block, float64: the same output, input gradient and
    parameter gradients (the shards' gathered), on each rank; the router's gradient is the full one on every rank
    (the routing weights' gradient all-reduced through f). A gated Mixtral-like block, and one with biases, no gate
    and no renormalisation (the experts' down biases weighted after the all-reduce)."""
    specs = {"gated": (mixtral_spec().model_dump(), 0),
             "biases, no gate, no renormalisation": (mixtral_spec().with_(
                 gated_mlp=False, bias=True, activation="gelu", normalize_topk=False, kv_heads=4).model_dump(), 0)}
    ranks = tp_block_errors(specs)
    for errors in ranks:
        for name, e in errors.items():
            assert e["router grad norm"] > 1e-3, name
            for what in ("output", "input grad", "router grad", "grads"):
                assert e[what] < 1e-12, (name, what, e)
            # Megatron's collectives, as the planner charges them: forward the attention's and the MLP's g
            # (T h each), backward one f before the attention and one before the experts (T h each), and the routing
            # weights' f (T k); not one f per linear, nor per expert
            T, h, k = 2 * 16, specs[name][0]["hidden"], specs[name][0]["experts_per_token"]
            assert sorted(e["all-reduces"]) == sorted([T * h] * 4 + [T * k]), (name, e["all-reduces"])
