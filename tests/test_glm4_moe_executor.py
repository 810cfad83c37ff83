"""GLM-4.5 and partial rotary in the executor (executor/models/llama.py's apply_rotary and attention's rotary_dim,
LlamaBlock.rotary_dim; executor/tensor_parallel.py's TensorParallelLlamaBlock.rotary_dim; planner/model.py's
rotary_dim, profiler/hf_config.py's glm4_moe): the tiny model of tests/fixtures/tiny-glm4-moe (3 layers, the first
dense, 8 experts in 2 groups of which 1 is chosen, sigmoid scores with the choice's bias, a shared expert, routed
scaling 2.5, query/key/value biases without an output bias, per-head q/k norms, 8 of each head's 16 dimensions
rotated) computes what transformers' Glm4MoeForCausalLM does with the same weights (float64, the router's bias
nonzero), also with heads x head_dim != hidden, and each of its pieces matters; a Phi-3 with partial_rotary_factor
0.75 computes what Phi3ForCausalLM does; our partial rotary is transformers' apply_rotary_pos_emb (GLM-4.5's and
Phi-3's); a block at t = 2 equals the whole block; and real runs (e = 2, t = 2, zb-h1) equal single-process training
(gloo, float64)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hf_parity import broken_diffs, built, copied, logits, randn
from run_support import assert_whole_block, launched_fixture, plans_of, tp_block_errors
from torch import nn

import executor.models.llama as llama
from executor.models import Stage, build_layers, get_config
from executor.models.llama import LlamaBlock, apply_rotary, attention, rotary_cos_sin
from planner.model import ModelSpec
from profiler.hf_config import read_hf_config

torch.set_num_threads(1)
FIXTURES = Path(__file__).resolve().parent / "fixtures"
GLM_FIXTURE = FIXTURES / "tiny-glm4-moe" / "config.json"
PHI3_FIXTURE = FIXTURES / "tiny-phi3" / "config.json"
#: logits' tolerance: transformers' Glm4MoeRMSNorm rounds through float32, as its router's logits and the rotary's
#: angles (inv_freq in float32), as in tests/test_gpt_oss_executor.py
TOL = 1e-5


def hf_data(fixture: Path, **changes: object) -> dict:  # type: ignore[type-arg]
    """The fixture's config.json with ``changes``."""
    return {**json.loads(fixture.read_text()), **changes}


def read(fixture: Path, name: str, **changes: object) -> ModelSpec:
    """``fixture``'s config.json with ``changes`` as profiler.hf_config reads it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(hf_data(fixture, **changes)))
        return read_hf_config(path, name=name)


#: the fixture as profiler.hf_config reads it
GLM = read(GLM_FIXTURE, "tiny-glm4-moe")
#: heads x head_dim != hidden (GLM-4.5's 96 x 128 over 4096): 4 heads of 24 over 64, 12 of each rotated
WIDE = {"head_dim": 24}
GLM_WIDE = read(GLM_FIXTURE, "tiny-glm4-moe-wide", **WIDE)
#: Phi-3 with partial_rotary_factor 0.75 (Phi-4-mini's): 12 of each head's 16 dimensions rotated
PARTIAL = {"partial_rotary_factor": 0.75}
PHI3_PARTIAL = read(PHI3_FIXTURE, "tiny-phi3-partial", **PARTIAL)


def test_specs_read_from_the_fixtures() -> None:
    """The fixture's ModelSpec has every GLM-4.5 piece the executor builds (what the other tests rely on), the
    variants theirs."""
    s = GLM
    assert (s.rotary_dim, s.rot_d, s.d, s.qk_norm, s.qkv_bias, s.bias) == (8, 8, 16, True, True, False)
    assert (s.experts, s.experts_per_token, s.router_score, s.router_bias, s.router_groups, s.router_group_topk,
            s.routed_scaling, s.normalize_topk) == (8, 2, "sigmoid", True, 2, 1, 2.5, True)
    assert (s.shared_expert_ffn_hidden, s.shared_expert_gate, s.dense_layers, s.f, s.f_e) == (32, False, (0,), 96, 32)
    assert (GLM_WIDE.d, GLM_WIDE.rot_d, GLM_WIDE.q_dim) == (24, 12, 96) and GLM_WIDE.q_dim != GLM_WIDE.hidden
    assert (PHI3_PARTIAL.d, PHI3_PARTIAL.rotary_dim) == (16, 12)
    blocks = build_layers(get_config(GLM), seed=1, start=1, stop=4)
    assert [b.rotary_dim for b in blocks] == [8] * 3 and [b.moe is None for b in blocks] == [True, False, False]
    assert all(b.o.bias is None and b.q.bias is not None and b.v.bias is not None for b in blocks)


def test_partial_rotary_as_transformers() -> None:
    """Our rotary on each head's first r dimensions (apply_rotary with rotary_cos_sin(s, r)) equals transformers'
    apply_rotary_pos_emb of GLM-4.5 and of Phi-3 (the same function) with the table their rotary embedding builds
    (its inv_freq in float32: 1e-6), the other d - r dimensions passed through untouched; with r = d it is the full
    rotary of before."""
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeRotaryEmbedding
    from transformers.models.glm4_moe.modeling_glm4_moe import apply_rotary_pos_emb as glm_rotary
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_rotary

    gen = torch.Generator().manual_seed(1)
    b, a, s, d = 2, 4, 16, 16
    q, k = (torch.randn(b, a, s, d, dtype=torch.float64, generator=gen) for _ in range(2))
    for factor, r in ((0.5, 8), (0.75, 12), (1.0, 16)):
        data = hf_data(GLM_FIXTURE, partial_rotary_factor=factor)
        data.pop("model_type")
        cos_t, sin_t = Glm4MoeRotaryEmbedding(Glm4MoeConfig(**data))(q, torch.arange(s)[None])
        cos, sin = rotary_cos_sin(s, r, 10000.0, q.device, q.dtype)
        assert cos.shape == (s, r) and cos_t.shape == (1, s, r)
        torch.testing.assert_close(cos, cos_t[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(sin, sin_t[0], rtol=1e-6, atol=1e-6)
        ours = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        for theirs in (glm_rotary(q, k, cos[None], sin[None]), phi3_rotary(q, k, cos[None], sin[None])):
            for mine, their in zip(ours, theirs, strict=True):
                torch.testing.assert_close(mine, their, rtol=0, atol=1e-15)
        assert torch.equal(ours[0][..., r:], q[..., r:])
        if r < d:
            assert (ours[0][..., :r] - q[..., :r]).abs().max() > 0.5
            full = apply_rotary(q, *rotary_cos_sin(s, d, 10000.0, q.device, q.dtype))
            assert (full - ours[0]).abs().max() > 0.5
    # attention's rotary_dim: the scores of the rotated part only (the rest pass through unrotated)
    v = torch.randn(b, a, s, d, dtype=torch.float64, generator=gen)
    cos, sin = rotary_cos_sin(s, 8, 10000.0, q.device, q.dtype)
    want = llama.causal_attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v)
    torch.testing.assert_close(attention(q, k, v, 10000.0, rotary_dim=8), want, rtol=0, atol=1e-15)
    assert (attention(q, k, v, 10000.0) - want).abs().max() > 1e-2


def hf_glm(**changes: object):  # type: ignore[no-untyped-def]
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    data = hf_data(GLM_FIXTURE, **changes)
    data.pop("model_type")
    return Glm4MoeForCausalLM(Glm4MoeConfig(**data, attn_implementation="eager", experts_implementation="eager"))


def copy_mlp(ours: nn.Module, theirs: nn.Module, gen: torch.Generator) -> None:
    """Our gated MLP (a dense layer's block, an expert, the shared expert: ``gate``, ``up``, ``down``), its weights
    drawn anew (activations of order one), into a Glm4MoeMLP (``gate_proj``, ``up_proj``, ``down_proj``)."""
    for lin, target, std in ((ours.gate, theirs.gate_proj, 0.25), (ours.up, theirs.up_proj, 0.25),
                             (ours.down, theirs.down_proj, 0.05)):
        lin.weight.copy_(randn(lin.weight, std, gen))
        target.weight.copy_(lin.weight)


def copy_block(ours: LlamaBlock, theirs: nn.Module, gen: torch.Generator) -> None:
    """Our block into transformers' Glm4MoeDecoderLayer, first moved off its initial values where those would hide a
    piece: q and k scaled up, the query/key/value biases of order one, every norm (the per-head q/k norms too) away
    from one, the MLPs' weights of order one, the router scaled up and DeepSeek-V3's bias of the choice
    (``e_score_correction_bias``, a buffer) nonzero."""
    at = theirs.self_attn
    for a, b in ((ours.q, at.q_proj), (ours.k, at.k_proj), (ours.v, at.v_proj), (ours.o, at.o_proj)):
        if a in (ours.q, ours.k):
            a.weight.mul_(10)
        b.weight.copy_(a.weight)
        if a is not ours.o:
            a.bias.copy_(randn(a.bias, 0.5, gen))
            b.bias.copy_(a.bias)
    assert ours.o.bias is None and at.o_proj.bias is None
    for norm, target in ((ours.input_norm, theirs.input_layernorm), (ours.post_norm, theirs.post_attention_layernorm),
                         (ours.q_norm, at.q_norm), (ours.k_norm, at.k_norm)):
        norm.weight.uniform_(0.5, 1.5, generator=gen)
        target.weight.copy_(norm.weight)
    if ours.moe is None:
        copy_mlp(ours, theirs.mlp, gen)
        return
    router, gate = ours.moe.router, theirs.mlp.gate
    router.weight.mul_(20)
    router.expert_bias.copy_(randn(router.expert_bias, 0.3, gen))
    gate.weight.copy_(router.weight)
    gate.e_score_correction_bias.copy_(router.expert_bias)
    experts = theirs.mlp.experts
    for e, ex in enumerate(ours.moe.experts):
        for lin, std in ((ex.gate, 0.25), (ex.up, 0.25), (ex.down, 0.05)):
            lin.weight.copy_(randn(lin.weight, std, gen))
        experts.gate_up_proj[e].copy_(torch.cat([ex.gate.weight, ex.up.weight]))  # (gate then up: its chunk(2))
        experts.down_proj[e].copy_(ex.down.weight)
    copy_mlp(ours.moe.shared_expert, theirs.mlp.shared_experts, gen)


def ours_and_theirs(spec: ModelSpec, changes: dict[str, object]):  # type: ignore[no-untyped-def]
    """Our layers of ``spec`` (float64), transformers' Glm4MoeForCausalLM of the fixture with ``changes`` with our
    weights copied in (moved off their initial values: :func:`copy_block`), and a batch of 2 x 16 tokens; the same
    parameter count, ModelSpec's."""
    cfg, layers, hf = built(spec, lambda: hf_glm(**changes))
    ids = copied(cfg, layers, hf, copy_block, torch.Generator().manual_seed(0))
    assert ids.shape == (2, 16)
    return layers, hf, ids


def _table_over_head_dim(d: int):  # type: ignore[no-untyped-def]
    """A wrong rotary table: the rotated part's angles ``m theta^(-2i/d)`` with the head's ``d``, not ``r``."""
    def table(seq, r, theta, device, dtype):  # type: ignore[no-untyped-def]
        cos, sin = rotary_cos_sin(seq, d, theta, device, dtype)
        return cos[:, :r // 2].repeat(1, 2), sin[:, :r // 2].repeat(1, 2)
    return table


def _last_dims_rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """A wrong partial rotary: the last ``r`` dimensions rotated, the first passed through."""
    r = cos.shape[-1]
    return torch.cat([x[..., :-r], apply_rotary(x[..., -r:], cos, sin)], dim=-1)


@pytest.mark.parametrize("which", ["fixture", "heads x head_dim != hidden"])
def test_same_logits_as_transformers(which: str) -> None:
    """Our weights copied into Glm4MoeForCausalLM (eager attention and experts, float64, the router's bias nonzero)
    give the same logits on a batch of 2 x 16 tokens, the fixture's and with 4 heads of 24 over a hidden 64 (12 of
    each rotated); and each GLM-4.5 piece matters: all of each head rotated, the rotated part's angles over the whole
    head, the last dimensions rotated instead of the first, no q/k norms, no query/key/value biases, no bias of the
    choice, no groups, no routed scaling, softmax scores, no shared expert: each differs by far more than the
    tolerance."""
    spec, changes = (GLM, {}) if which == "fixture" else (GLM_WIDE, WIDE)
    layers, hf, ids = ours_and_theirs(spec, changes)
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)
        blocks = layers[1:-1]
        routers = [b.moe.router for b in blocks if b.moe is not None]
        assert len(routers) == 2
        broken = {
            "all of each head rotated": [(b, "rotary_dim", b.head_dim) for b in blocks],
            "angles over the whole head": [(llama, "rotary_cos_sin", _table_over_head_dim(spec.d))],
            "last dimensions rotated": [(llama, "apply_rotary", _last_dims_rotated)],
            "no q/k norms": [(b, n, None) for b in blocks for n in ("q_norm", "k_norm")],
            "no q/k/v biases": [(lin, "bias", None) for b in blocks for lin in (b.q, b.k, b.v)],
            "no bias of the choice": [(r, "expert_bias", None) for r in routers],
            "no groups": [(r, "groups", None) for r in routers],
            "no routed scaling": [(r, "scaling", 1.0) for r in routers],
            "softmax scores": [(r, "score", "softmax") for r in routers],
            "no shared expert": [(b.moe, "shared_expert", None) for b in blocks if b.moe is not None],
        }
        diffs = broken_diffs(layers, ids, want, broken)
        assert all(diff > 100 * TOL for diff in diffs.values()), diffs
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)


def test_router_chooses_as_transformers() -> None:
    """Our Router (sigmoid scores, the choice's bias, 2 groups of which 1, renormalised, times 2.5) chooses and
    weighs what Glm4MoeTopkRouter does with the same weight and e_score_correction_bias (float32's precision: both
    route in float32); without the bias the choice differs for some tokens."""
    from executor.models.llama import route

    layers, hf, _ = ours_and_theirs(GLM, {})
    ours, theirs = layers[2].moe.router, hf.model.layers[1].mlp.gate
    x = torch.randn(64, GLM.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        weights, index = ours.choose(x, x.dtype)
        _, their_weights, their_index = theirs(x)
        order, their_order = index.argsort(dim=-1), their_index.argsort(dim=-1)
        assert torch.equal(index.gather(1, order), their_index.gather(1, their_order))
        torch.testing.assert_close(weights.gather(1, order), their_weights.gather(1, their_order).double(),
                                   rtol=1e-6, atol=1e-6)
        unbiased = route(x @ ours.weight.T, ours.top_k, ours.normalize, x.dtype, ours.score, ours.groups,
                         ours.group_topk, None, ours.scaling)[1]
        assert (unbiased.sort(dim=-1).values != index.sort(dim=-1).values).any(dim=-1).sum() > 3


def test_phi3_partial_rotary_same_logits_as_transformers() -> None:
    """Phi-3 with partial_rotary_factor 0.75 (12 of each head's 16 dimensions rotated, as Phi-4-mini's 96 of 128):
    our weights copied into Phi3ForCausalLM (fused qkv_proj and gate_up_proj; q and k scaled up so that positions
    weigh in the scores, norms away from one) give the same logits; all 16 rotated, the table over the whole head
    or the last 12 rotated differ by far more."""
    from transformers import Phi3Config, Phi3ForCausalLM

    cfg = get_config(PHI3_PARTIAL)
    data = hf_data(PHI3_FIXTURE, **PARTIAL)
    data.pop("model_type")
    hf = Phi3ForCausalLM(Phi3Config(**data, attn_implementation="eager")).double().eval()
    layers = [m.double().eval() for m in build_layers(cfg, seed=2)]
    assert sum(p.numel() for p in hf.parameters()) == cfg.total_params()

    def copy_phi3_block(ours: LlamaBlock, theirs: nn.Module, gen: torch.Generator) -> None:
        assert ours.rotary_dim == 12
        ours.q.weight.mul_(10)
        ours.k.weight.mul_(10)
        theirs.self_attn.qkv_proj.weight.copy_(torch.cat([ours.q.weight, ours.k.weight, ours.v.weight]))
        theirs.self_attn.o_proj.weight.copy_(ours.o.weight)
        theirs.mlp.gate_up_proj.weight.copy_(torch.cat([ours.gate.weight, ours.up.weight]))
        theirs.mlp.down_proj.weight.copy_(ours.down.weight)
        for norm, target in ((ours.input_norm, theirs.input_layernorm),
                             (ours.post_norm, theirs.post_attention_layernorm)):
            norm.weight.uniform_(0.5, 1.5, generator=gen)
            target.weight.copy_(norm.weight)

    ids = copied(cfg, layers, hf, copy_phi3_block, torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)
        blocks = layers[1:-1]
        diffs = broken_diffs(layers, ids, want, {
            "all of each head rotated": [(b, "rotary_dim", 16) for b in blocks],
            "angles over the whole head": [(llama, "rotary_cos_sin", _table_over_head_dim(16))],
            "last dimensions rotated": [(llama, "apply_rotary", _last_dims_rotated)],
        })
        assert all(diff > 100 * TOL for diff in diffs.values()), diffs


def test_parameter_counts() -> None:
    """Every block's parameters are ModelSpec.block_params(i) (q/k/v biases, no output bias, the per-head norms, the
    shared expert, the dense first layer), the model's ModelSpec.total_params(); the router's bias of the choice is a
    buffer, not a parameter."""
    for spec in (GLM, GLM_WIDE, PHI3_PARTIAL):
        layers = build_layers(get_config(spec), seed=1)
        assert [sum(p.numel() for p in m.parameters()) for m in layers[1:-1]] == [
            spec.block_params(i) for i in range(spec.layers)]
        assert sum(p.numel() for p in Stage(layers).parameters()) == spec.total_params()
    block = build_layers(get_config(GLM), seed=1, start=2, stop=3)[0]
    assert "moe.router.expert_bias" in dict(block.named_buffers())
    assert "moe.router.expert_bias" not in dict(block.named_parameters())


@pytest.mark.slow
def test_tensor_parallel_block_equals_whole_block() -> None:
    """t = 2 (gloo, two processes) against the whole block, float64 (tests/tp_block_probe.py: every bias perturbed,
    DeepSeek-V3's bias of the choice spread): the same output, input gradient and parameter gradients (the shards'
    gathered under the whole block's names) for GLM-4.5's dense first layer and a MoE layer, one with heads x head_dim
    != hidden, one with a single key/value head (k and v replicated), and Phi-3 with 12 of 16 rotated. Split: q, k,
    v with their biases by heads (each rank rotating its heads' first dimensions), o by columns without a bias, each
    expert's and the shared expert's gate and up by columns and down by rows; the router and the q/k norms whole.
    Collectives: the attention's f and g (T h each), the q/k norms' weights' f (d each: each rank's heads' share of
    their gradient), with one key/value head k's and v's weights' and biases' f (replicated), a dense MLP's f and g,
    or the experts' f and g, the routing weights' f (T k) and the shared expert's own f and g (T h each)."""
    specs = {"glm dense": (GLM.model_dump(), 0), "glm moe": (GLM.model_dump(), 1),
             "glm heads x head_dim != hidden": (GLM_WIDE.model_dump(), 2),
             "glm kv replicated": (GLM.with_(kv_heads=1).model_dump(), 1),
             "phi3 partial rotary": (PHI3_PARTIAL.model_dump(), 0)}
    ranks = tp_block_errors(specs)
    T, h, k = 2 * 16, 64, 2
    for errors in ranks:
        for name, e in errors.items():
            assert_whole_block(name, e)
            names, split = set(e["names"]), set(e["split"])
            assert {"q.weight", "o.weight"} <= split and "o.bias" not in names, (name, e)
            if name.startswith("phi3"):
                assert sorted(e["all-reduces"]) == [T * h] * 4, (name, e["all-reduces"])
                continue
            d = specs[name][0]["head_dim"]
            attention = [T * h] * 2 + [d] * 2 + ([d * h, d] * 2 if name == "glm kv replicated" else [])
            assert {"q.bias", "k.bias", "v.bias", "q_norm.weight", "k_norm.weight"} <= names, (name, names)
            assert "q.bias" in split and not {"q_norm.weight", "k_norm.weight"} & split, (name, split)
            kv = {"k.weight", "k.bias", "v.weight", "v.bias"}
            assert (not kv & split) if name == "glm kv replicated" else kv <= split, (name, split)
            if name == "glm dense":
                assert {"gate.weight", "up.weight", "down.weight"} <= split, (name, split)
                assert sorted(e["all-reduces"]) == sorted(attention + [T * h] * 2), (name, e["all-reduces"])
                continue
            assert e["router grad"] < 1e-12 and e["router grad norm"] > 1e-6, (name, e)
            assert "moe.router.weight" not in split and "moe.shared_expert.up.weight" in split, (name, split)
            assert {f"moe.experts.{j}.{n}.weight" for j in range(8) for n in ("gate", "up", "down")} <= split
            assert sorted(e["all-reduces"]) == sorted(attention + [T * h] * 4 + [T * k]), (name, e["all-reduces"])


P = plans_of(GLM)


RUNS_2 = {
    "t=2": P("1f1b", 1, 2, tensor=2),
    "t=2 heads x head_dim != hidden": P("1f1b", 1, 2, GLM_WIDE, tensor=2),
    "t=2 phi3 partial rotary": P("1f1b", 1, 2, PHI3_PARTIAL, tensor=2),
    "zb-h1 D=2 (split backward)": P("zb-h1", 2, 4),
}
RUNS_4 = {
    "1f1b D=2 W=2 e=2": P("1f1b", 2, 2, data=2, expert=2),
    "1f1b D=2 t=2": P("1f1b", 2, 2, tensor=2),
    "t=2 e=2 W=2": P("1f1b", 1, 2, data=2, expert=2, tensor=2),
}


runs = launched_fixture((RUNS_2, 2), (RUNS_4, 4))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS_2, *RUNS_4])
def test_run_equals_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    """Real runs (gloo, float64) with --check: the parameters after two steps equal single-process training's (the
    q/k/v biases gathered from their head shards at t = 2, the q/k norms, the shared expert, the experts under
    e = 2), and so do the routers' biases of the choice, moved by the experts' loads after each step."""
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]
