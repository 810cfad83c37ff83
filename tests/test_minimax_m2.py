"""MiniMax-M2 (``minimax_m2``: transformers' ``MiniMaxM2Config``, ``MiniMaxM2ForCausalLM``, ``MiniMaxM2Attention``,
``MiniMaxM2SparseMoeBlock``, ``MiniMaxM2TopKRouter``; the model card of MiniMaxAI/MiniMax-M2) read, run, planned and
exported with fields ModelSpec already has: grouped-query attention without biases and with ``a d != h``, one RMSNorm
over the whole query projection and one over the whole key projection before the rotary (``qk_norm_scope``
projection, OLMo 2's; pre-norm), the first ``rotary_dim`` of each head rotated (GLM-4.5's partial rotary), and a
mixture of experts on every layer routed as DeepSeek-V3 without groups, scaling nor a shared expert (sigmoid scores,
the choice by score plus ``e_score_correction_bias``, the chosen sigmoids renormalised).

tests/fixtures/tiny-minimax-m2 (4 layers, hidden 64, 4 heads of 32, 2 key/value heads, 16 of 32 rotated, 8 experts of
32, top 2) read field for field; examples/models/minimax-m2 counted as transformers counts it; each field ModelSpec
cannot say refused naming it; our layers' logits equal MiniMaxM2ForCausalLM's (float64) and each piece matters; a
block at t = 2 equals the whole block; a run at e = 2 equals single-process training; the analytical profile plans;
the Megatron-LM export refuses it naming qk_norm_scope and torchtitan's export notes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hf_parity import broken_diffs, built, copied, logits, randn
from moe_support import H100, h100_cluster
from run_support import assert_whole_block, direct, launched_fixture, tp_block_errors
from surfaces_support import script_flags, two_stage_input
from torch import nn

from executor.models import Stage, build_layers, get_config
from executor.models.llama import LlamaBlock, route
from planner.analytic import analytic_profile
from planner.export import ExportError, export, parse
from planner.operators import OperatorOptions
from planner.request import TrainingRequest
from planner.search import plan
from profiler.hf_config import HFConfigError, read_hf_config, spec_from_hf_dict

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-minimax-m2" / "config.json"
EXAMPLE = ROOT / "examples" / "models" / "minimax-m2"
SPEC = read_hf_config(FIXTURE)
#: logits' tolerance: transformers' MiniMaxM2RMSNorm rounds through float32 (the query/key norms too), as do its
#: rotary angles (inv_freq in float32) and its routing weights (sigmoid of the logits' float())
TOL = 1e-5
#: examples/models/minimax-m2 as ModelSpec.total_params() and transformers' MiniMaxM2ForCausalLM count it
TOTAL = 228_689_748_992


def _data(**changes: object) -> dict[str, Any]:
    """The fixture's fields with ``changes`` (a None value: the field left out)."""
    data = json.loads(FIXTURE.read_text())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_the_fixture_field_for_field() -> None:
    """tests/fixtures/tiny-minimax-m2: 4 layers of hidden 64, 4 query heads of 32 (a d = 128 != h) over 2 key/value
    heads, the query and key norms over the whole projections (128 and 64 wide), pre-norm, 16 of each head's 32
    dimensions rotated at base 5e6, 8 experts of 32 on every layer, top 2 by sigmoid plus the choice's bias,
    renormalised, no groups, no scaling, no shared expert, no biases, an untied head, rms_norm_eps 1e-6; each block
    builds those pieces and holds ModelSpec.block_params(i)."""
    s = SPEC
    assert (s.name, s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.vocab, s.seq) == (
        "tiny-minimax-m2", 4, 64, 4, 2, 32, 128, 16)
    assert (s.q_dim, s.kv_dim, s.rotary_dim, s.rot_d, s.rope_theta, s.norm_eps) == (128, 64, 16, 16, 5e6, 1e-6)
    assert (s.gated_mlp, s.activation, s.norm, s.position, s.tied_embeddings, s.bias, s.qkv_bias) == (
        True, "silu", "rmsnorm", "rotary", False, False, False)
    assert (s.qk_norm, s.qk_norm_scope, s.post_norm, s.sandwich_norm, s.qk_l2_norm) == (
        True, "projection", False, False, False)
    assert (s.experts, s.experts_per_token, s.expert_ffn_hidden, s.dense_layers) == (8, 2, 32, ())
    assert (s.router_score, s.router_bias, s.normalize_topk, s.routed_scaling) == ("sigmoid", True, True, 1.0)
    assert (s.router_groups, s.shared_expert_ffn_hidden, s.router_weights_on_input, s.sliding_window) == (
        None, None, False, None)
    assert s.source == f"Hugging Face config {FIXTURE}"  # nothing not modelled to note
    layers = build_layers(get_config(s), seed=1)
    for i, b in enumerate(layers[1:-1]):
        assert b.projection_norms and b.q_norm.weight.shape == (128,) and b.k_norm.weight.shape == (64,)
        assert b.input_norm is not None and b.post_norm is not None and b.attn_out_norm is None
        assert b.rotary_dim == 16 and b.q.bias is None and b.o.weight.shape == (64, 128)
        router = b.moe.router
        assert (router.score, router.normalize, router.groups, router.scaling, b.moe.shared_expert) == (
            "sigmoid", True, None, 1.0, None)
        assert router.expert_bias is not None and "moe.router.expert_bias" not in dict(b.named_parameters())
        assert sum(p.numel() for p in b.parameters()) == s.block_params(i) == 74_560
    assert sum(p.numel() for p in Stage(layers).parameters()) == s.total_params() == 314_688


def _transformers_count(data: dict[str, Any]) -> int:
    """transformers' MiniMaxM2ForCausalLM of a config.json's fields, built on the meta device (no memory): its
    parameter count (the routers' e_score_correction_bias is a buffer, not counted)."""
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    with torch.device("meta"):
        model = MiniMaxM2ForCausalLM(MiniMaxM2Config(**{k: v for k, v in data.items() if k != "model_type"}))
    return sum(p.numel() for p in model.parameters())


def test_the_published_config() -> None:
    """MiniMaxAI/MiniMax-M2: 62 layers of hidden 3072, 48 heads of 128 (6144 != 3072) over 8 key/value heads, the
    norms over the whole projections (6144 and 1024 wide), 64 of 128 rotated at base 5e6, 256 experts of 1536, top 8,
    a vocabulary of 200,064, 196,608 positions. 228,689,748,992 parameters, as transformers' MiniMaxM2ForCausalLM
    counts them (the model card's "230 billion total parameters with 10 billion active"); the Hub's safetensors
    count, 228,703,644,928, adds each layer's 256 e_score_correction_bias entries (a buffer) and the fp8 weights'
    scales (one float per 128 x 128 block of every expert and attention projection: quantization_config's
    weight_block_size). Active per token: 11.03B with the embedding and the head, 9.80B without. The multi-token
    prediction modules (use_mtp, num_mtp_modules 3), which transformers does not build, are noted."""
    data = json.loads((EXAMPLE / "config.json").read_text())
    s = read_hf_config(EXAMPLE)
    assert (s.layers, s.hidden, s.heads, s.k, s.d, s.q_dim, s.kv_dim, s.vocab, s.seq) == (
        62, 3072, 48, 8, 128, 6144, 1024, 200064, 196608)
    assert (s.rotary_dim, s.rope_theta, s.norm_eps, s.qk_norm_scope, s.tied_embeddings) == (
        64, 5e6, 1e-6, "projection", False)
    assert (s.experts, s.experts_per_token, s.f_e, s.router_score, s.router_bias, s.normalize_topk) == (
        256, 8, 1536, "sigmoid", True, True)
    assert s.total_params() == _transformers_count(data) == TOTAL
    bias_buffers = s.layers * s.experts
    blocks = s.layers * (s.experts * 3 * (1536 // 128) * (3072 // 128)  # gate, up, down of every expert
                         + 2 * (6144 // 128) * (3072 // 128) + 2 * (1024 // 128) * (3072 // 128))  # q, o; k, v
    assert TOTAL + bias_buffers + blocks == 228_703_644_928
    per_layer = s.attention_params() + s.active_mlp_params() + s.norms_per_layer * s.norm_params() + s.qk_norm_params()
    active = s.embedding_params() + s.layers * per_layer + s.head_params()
    assert active == 11_030_537_216 and active - s.embedding_params() - s.head_params() == 9_801_340_928
    assert "num_mtp_modules (3)" in s.source and "not planned" in s.source


def test_rotary_dim_read_through_transformers() -> None:
    """MiniMax-M2's legacy ``rotary_dim`` and rope_parameters' ``partial_rotary_factor`` are the same field to
    transformers (``MiniMaxM2Config.convert_rope_params_to_dict``: the factor rotary_dim / head_dim) and to the reader:
    16 of 32 either way; neither: every dimension (transformers' default is no partial rotary, not M2's 64); the two
    disagreeing (transformers keeps the factor) refused naming rotary_dim."""
    factor = {"rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5}}
    by_factor = spec_from_hf_dict(_data(rotary_dim=None, rope_theta=None, **factor), "tiny-minimax-m2")
    assert by_factor.rotary_dim == 16 and by_factor == spec_from_hf_dict(_data(), "tiny-minimax-m2")
    assert spec_from_hf_dict(_data(rotary_dim=None), "t").rotary_dim is None
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_data(**factor, rope_theta=None, rotary_dim=8))
    assert err.value.field == "rotary_dim" and "partial_rotary_factor 0.5" in err.value.message


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"num_key_value_heads": None}, "num_key_value_heads", "missing"),
    ({"head_dim": None}, "head_dim", "missing"),
    ({"num_local_experts": None}, "num_local_experts", "missing"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok", "missing"),
    ({"intermediate_size": None}, "intermediate_size", "missing"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok", "more than the 8 experts"),
    ({"rotary_dim": 15}, "rotary_dim", "a whole, even number"),
    ({"rotary_dim": 34}, "rotary_dim", "at most head_dim (32)"),
    ({"rotary_dim": 0}, "rotary_dim", "a whole, even number"),
    ({"rotary_dim": "16"}, "rotary_dim", "a whole, even number"),
    ({"use_qk_norm": False}, "use_qk_norm", "MiniMaxM2Attention"),
    ({"use_qk_norm": "yes"}, "use_qk_norm", "true or false"),
    ({"qk_norm_type": "per_head"}, "qk_norm_type", "per_layer"),
    ({"scoring_func": "softmax"}, "scoring_func", "MiniMaxM2TopKRouter"),
    ({"shared_intermediate_size": 1024}, "shared_intermediate_size", "no shared expert"),
    ({"shared_intermediate_size": [0, 8]}, "shared_intermediate_size", "no shared expert"),
    ({"attn_type_list": [1, 0, 1, 1]}, "attn_type_list", "full attention"),
    ({"attn_type_list": "all"}, "attn_type_list", "full attention"),
])
def test_refusals_name_the_field(changes: dict[str, object], field: str, words: str) -> None:
    """What transformers' MiniMaxM2 would fill in with M2's own shape (key/value heads, head_dim) or the experts'
    fields missing, and what ModelSpec cannot say or transformers would not compute as the file says: refused naming
    the file's field."""
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_data(**changes), "t")
    assert err.value.field == field and words in err.value.message, err.value


def test_what_is_read_and_noted() -> None:
    """Absent, the published extras change nothing (transformers' own model builds the same); ``attention_bias`` and
    ``mlp_bias`` are ignored as transformers ignores them (MiniMaxM2Attention's and the experts' linears have no
    bias); ``use_routing_bias`` false drops the choice's bias (transformers' buffer stays at its zeros); a jitter and
    the multi-token prediction modules are noted as not modelled."""
    bare = spec_from_hf_dict(_data(**{k: None for k in ("use_qk_norm", "qk_norm_type", "scoring_func",
                                                        "use_routing_bias", "shared_intermediate_size",
                                                        "attn_type_list")}), "tiny-minimax-m2")
    assert bare == spec_from_hf_dict(_data(), "tiny-minimax-m2")
    assert spec_from_hf_dict(_data(attention_bias=True, mlp_bias=True), "tiny-minimax-m2") == bare
    assert not spec_from_hf_dict(_data(use_routing_bias=False), "t").router_bias
    noted = spec_from_hf_dict(_data(router_jitter_noise=0.01, use_mtp=True, num_mtp_modules=3), "t").source
    assert "router_jitter_noise (0.01) not modelled" in noted and "num_mtp_modules (3)" in noted
    assert "num_mtp_modules" not in spec_from_hf_dict(_data(use_mtp=False, num_mtp_modules=3), "t").source


# ---- the executor against transformers -------------------------------------------------------------------------------

def hf_model(**changes: object) -> nn.Module:
    """transformers' MiniMaxM2ForCausalLM of the fixture (eager attention and experts)."""
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    data = _data(**changes)
    data.pop("model_type")
    return MiniMaxM2ForCausalLM(MiniMaxM2Config(**data, attn_implementation="eager", experts_implementation="eager"))


def copy_block(ours: LlamaBlock, theirs: nn.Module, gen: torch.Generator) -> None:
    """Our block into transformers' MiniMaxM2DecoderLayer, first moved off its initial values where those would hide
    a piece: q and k scaled up (positions weigh in the scores), every norm (the query and key norms' a d and k d too)
    away from one, the experts' weights of order one, the router scaled up and the bias of the choice (our
    ``expert_bias``, their ``e_score_correction_bias`` buffer) nonzero."""
    at = theirs.self_attn
    for a, b in ((ours.q, at.q_proj), (ours.k, at.k_proj), (ours.v, at.v_proj), (ours.o, at.o_proj)):
        if a is ours.q or a is ours.k:
            a.weight.mul_(10)
        b.weight.copy_(a.weight)
        assert a.bias is None and b.bias is None
    for norm, target in ((ours.input_norm, theirs.input_layernorm), (ours.post_norm, theirs.post_attention_layernorm),
                         (ours.q_norm, at.q_norm), (ours.k_norm, at.k_norm)):
        assert norm.weight.shape == target.weight.shape
        norm.weight.uniform_(0.5, 1.5, generator=gen)
        target.weight.copy_(norm.weight)
    router, moe = ours.moe.router, theirs.mlp
    router.weight.mul_(20)
    router.expert_bias.copy_(randn(router.expert_bias, 0.3, gen))
    moe.gate.weight.copy_(router.weight)
    moe.e_score_correction_bias.copy_(router.expert_bias)
    for e, ex in enumerate(ours.moe.experts):
        for lin, std in ((ex.gate, 0.25), (ex.up, 0.25), (ex.down, 0.05)):
            lin.weight.copy_(randn(lin.weight, std, gen))
        moe.experts.gate_up_proj[e].copy_(torch.cat([ex.gate.weight, ex.up.weight]))  # (gate then up: chunk(2))
        moe.experts.down_proj[e].copy_(ex.down.weight)


def ours_and_theirs():  # type: ignore[no-untyped-def]
    """Our layers of the fixture (float64), transformers' model with our weights copied in (:func:`copy_block`; the
    final norm off one too), and a batch of 2 x 16 tokens; the same parameter count, ModelSpec's."""
    cfg, layers, hf = built(SPEC, hf_model)
    ids = copied(cfg, layers, hf, copy_block, torch.Generator().manual_seed(0), norm_off_one=True)
    assert ids.shape == (2, 16)
    return layers, hf, ids


class _PerHead(nn.Module):
    """A wrong scope: the projection-wide norm's weights applied with each head's row normed alone (Qwen3's scope,
    Megatron-LM's --qk-layernorm)."""

    def __init__(self, norm: nn.Module, d: int) -> None:
        super().__init__()
        self.norm, self.d = norm, d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = x.unflatten(-1, (-1, self.d))
        return F.rms_norm(heads, (self.d,), None, self.norm.eps).flatten(-2) * self.norm.weight


def test_same_logits_as_transformers() -> None:
    """Our weights copied into MiniMaxM2ForCausalLM (eager attention and experts, float64, the choice's bias nonzero)
    give the same logits on a batch of 2 x 16 tokens; and each MiniMax-M2 piece matters: the query/key norms over
    each head instead of the whole projections, or none; all 32 of each head rotated instead of 16; no bias of the
    choice; the chosen weights not renormalised; softmax scores: each differs by far more than the tolerance."""
    layers, hf, ids = ours_and_theirs()
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)
        blocks = layers[1:-1]
        routers = [b.moe.router for b in blocks]
        diffs = broken_diffs(layers, ids, want, {
            "q/k norms over each head": [(b, n, _PerHead(getattr(b, n), SPEC.d)) for b in blocks
                                         for n in ("q_norm", "k_norm")],
            "no q/k norms": [(b, n, None) for b in blocks for n in ("q_norm", "k_norm")],
            "all of each head rotated": [(b, "rotary_dim", b.head_dim) for b in blocks],
            "no bias of the choice": [(r, "expert_bias", None) for r in routers],
            "not renormalised": [(r, "normalize", False) for r in routers],
            "softmax scores": [(r, "score", "softmax") for r in routers],
        })
        assert all(diff > 100 * TOL for diff in diffs.values()), diffs
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)


def test_router_weighs_exactly_as_transformers() -> None:
    """Our Router chooses the experts MiniMaxM2TopKRouter chooses (with the same weight and a nonzero
    e_score_correction_bias) and weighs them with the very same numbers (both in float32): route()'s sigmoid
    denominator adds DeepSeek-V3's 1e-20, which MiniMax's does not, but 1e-20 is below half a float32 step of any
    sum of 2.3e-13 or more (a sum of chosen sigmoids is at least its largest, sigmoid(-29) = 2.5e-13), so the
    quotient is the same float; without the bias some tokens choose other experts."""
    from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2TopKRouter

    layers, hf, _ = ours_and_theirs()
    ours = layers[2].moe.router
    theirs: MiniMaxM2TopKRouter = hf.model.layers[1].mlp.gate
    bias = hf.model.layers[1].mlp.e_score_correction_bias
    x = torch.randn(256, SPEC.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        weights, index = ours.choose(x, torch.float32)
        _, their_weights, their_index = theirs(x, bias)
        order, their_order = index.argsort(dim=-1), their_index.argsort(dim=-1)
        assert torch.equal(index.gather(1, order), their_index.gather(1, their_order))
        assert torch.equal(weights.gather(1, order), their_weights.gather(1, their_order))
        sums = torch.logspace(-12.6, 0, 10_000, dtype=torch.float64).float()
        assert torch.equal(sums + 1e-20, sums)
        unbiased = route(x @ ours.weight.T, ours.top_k, ours.normalize, x.dtype, ours.score)[1]
        assert (unbiased.sort(dim=-1).values != index.sort(dim=-1).values).any(dim=-1).sum() > 3


# ---- parallel runs ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_tensor_parallel_block_equals_whole_block() -> None:
    """t = 2 (gloo, two processes) against the whole block, float64 (tests/tp_block_probe.py: every norm off one, the
    choice's bias spread): the same output, input gradient and parameter gradients, with the key/value heads split and
    with one key/value head (replicated). The query norm's a d weights split with q's columns, the key norm's k d with
    k's where k is split (whole where replicated), each expert's gate and up by columns and down by rows; the router
    whole. Collectives: each split norm one all-reduce of the T = 32 rows' sums forward and one backward, the
    attention's and the experts' f and g (T h each) and the routing weights' f (T k); with k replicated, the key norm's
    weight's f (k d) and k's and v's weights' (k d h) instead of its rows' sums."""
    probed = {"minimax": (SPEC.model_dump(), 0), "minimax kv replicated": (SPEC.with_(kv_heads=1).model_dump(), 1)}
    T, h, k = 2 * 16, 64, 2
    for errors in tp_block_errors(probed):
        assert set(errors) == set(probed)
        for name, e in errors.items():
            assert_whole_block(name, e)
            split = set(e["split"])
            assert {"q_norm.weight", "q.weight", "o.weight"} <= split, (name, split)
            assert e["router grad"] < 1e-12 and e["router grad norm"] > 1e-6, (name, e)
            assert "moe.router.weight" not in split and "moe.experts.0.down.weight" in split, (name, split)
            replicated = name.endswith("kv replicated")
            kv = {"k_norm.weight", "k.weight", "v.weight"}
            assert (not kv & split) if replicated else kv <= split, (name, split)
            kd = SPEC.with_(kv_heads=1).kv_dim if replicated else SPEC.kv_dim
            norms = [T] * 2 + ([kd, kd * h, kd * h] if replicated else [T] * 2)
            assert sorted(e["all-reduces"]) == sorted(norms + [T * h] * 4 + [T * k]), (name, e["all-reduces"])


RUNS = {"1f1b D=2 W=2 e=2": direct(SPEC, "1f1b", 2, 2, data=2, expert=2)}
runs = launched_fixture((RUNS, 4))


@pytest.mark.slow
def test_run_equals_single_process(runs) -> None:  # type: ignore[no-untyped-def]
    """A real run (gloo, float64, 2 stages, 2 data-parallel replicas, the experts split over e = 2) with --check: the
    parameters after two steps equal single-process training's, and so do the routers' biases of the choice, moved by
    the experts' loads after each step."""
    check = runs["1f1b D=2 W=2 e=2"]["check"]
    assert check["ok"] is True, check["message"]


# ---- the planner and the exports -------------------------------------------------------------------------------------

def test_plan_minimax_m2() -> None:
    """MiniMax-M2's analytical profile on the H100 (4096 tokens, flash attention, sequence parallelism) holds its
    parameters, and the search plans it on 64 H100s with expert parallelism."""
    spec = read_hf_config(EXAMPLE, seq=4096)
    prof = analytic_profile(spec, H100, options=OperatorOptions(attention="flash", causal=True, dropout=False,
                                                                sequence_parallel=True), micro_batches=(1,))
    assert prof.total_params == spec.total_params() == TOTAL
    res = plan(prof, h100_cluster(), TrainingRequest(global_batch=256, gpus=64, top=3))
    assert res.candidates and res.candidates[0].config.expert > 1


def test_megatron_refuses_and_torchtitan_notes_the_projection_norms() -> None:
    """Megatron-LM's one query/key norm, --qk-layernorm, norms each head: the export refuses MiniMax-M2 naming
    qk_norm_scope (the widths 48 x 128 = 6144 and 8 x 128 = 1024), before anything is written, at any t; the same model
    with per-head norms is written (sigmoid scores with the expert bias, 64 of 128 rotated, 128 channels per head) and
    read back. torchtitan's export notes that its model is not this one, naming qk_norm_scope."""
    spec = read_hf_config(EXAMPLE, seq=4096)
    for t in (1, 2, 8):
        with pytest.raises(ExportError, match="^megatron: qk_norm_scope projection: ") as err:
            export("megatron", two_stage_input(spec, 8, tensor=t, expert=2, order="tp-dp-pp"))
        assert "(48 heads x 128 = 6144 wide)" in str(err.value) and "(8 x 128 = 1024)" in str(err.value)
        assert "post_norm" not in str(err.value) and "MiniMaxM2Attention: q_norm(q_proj(x))" in str(err.value)
    per_head = spec.with_(qk_norm_scope="head")
    out = export("megatron", two_stage_input(per_head, 8, tensor=2, expert=2, order="tp-dp-pp"))
    flags = script_flags(out.main.content)
    assert (flags["--qk-layernorm"], flags["--kv-channels"], flags["--rotary-percent"]) == ("", "128", "0.5")
    assert (flags["--moe-router-score-function"], flags["--moe-router-enable-expert-bias"]) == ("sigmoid", "")
    assert (flags["--num-experts"], flags["--moe-router-topk"], flags["--moe-ffn-hidden-size"]) == ("256", "8", "1536")
    back = parse(out)
    for field in ("qk_norm", "router_score", "router_bias", "normalize_topk", "rotary_dim"):
        assert getattr(back, field) == getattr(per_head, field), field
    notes = export("torchtitan", two_stage_input(SPEC, 8, tensor=1)).notes
    assert any("(qk_norm_scope projection)" in n for n in notes), notes
