"""Multi-head latent attention and DeepSeek's routing in the executor (executor/models/mla.py; executor/models/
llama.py's route and Router; planner/model.py's kv_lora_rank, q_lora_rank, qk_rope_head_dim, v_head_dim, router_score,
router_groups/router_group_topk, router_bias, routed_scaling): tiny DeepSeek-V3-, V2-Lite- and V2-like models compute
what transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM do with the same weights (float64), attention and
router each alone too, and each piece matters; their parameter counts are ModelSpec's; a block at t = 2 (split by
heads as Megatron-Core's MLASelfAttention) equals the whole block; and runs at t = 2, e = 2 (also with t = 2) and with a
2-stage pipeline equal single-process training (gloo, float64)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from hf_parity import copy_routed_experts
from moe_support import TINY_DEEPSEEK_V3
from run_support import assert_whole_block, launched_fixture, plans_of, tp_block_errors
from torch import nn

from executor.models import Stage, build_layers, get_config
from executor.models.data import synthetic_batch
from executor.models.llama import LlamaBlock, Router, SparseMoE
from executor.models.mla import LatentAttention
from executor.plan import PlanError, RunPlan
from planner.model import ModelSpec
from profiler.hf_config import read_hf_config

torch.set_num_threads(1)

V3 = TINY_DEEPSEEK_V3
#: DeepSeek-V2-Lite's form: queries projected directly, softmax top-2 (greedy), neither renormalised nor scaled
V2_LITE = V3.with_(name="tiny-deepseek-v2-lite", q_lora_rank=None, router_score="softmax", router_groups=None,
                   router_group_topk=None, router_bias=False, routed_scaling=1.0, normalize_topk=False)
#: DeepSeek-V2's: a query latent, softmax scores, group-limited (a group's score its best expert's), scaled by 16; top
#: 3 in 2 groups (the top k in top-k groups would never leave them: a group's score is its best expert's)
V2_GROUP = V2_LITE.with_(name="tiny-deepseek-v2", q_lora_rank=48, router_groups=4, router_group_topk=2,
                         experts_per_token=3, routed_scaling=16.0)
SPECS = {"v3": V3, "v2-lite": V2_LITE, "v2-group": V2_GROUP}


def hf_deepseek(spec: ModelSpec):  # type: ignore[no-untyped-def]
    """transformers' model of ``spec``: V3 with sigmoid scores, else V2 (greedy or group_limited_greedy)."""
    common = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.f,
                  moe_intermediate_size=spec.f_e, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                  num_key_value_heads=spec.heads, n_shared_experts=spec.shared_expert_ffn_hidden // spec.f_e,
                  n_routed_experts=spec.experts, routed_scaling_factor=spec.routed_scaling,
                  kv_lora_rank=spec.kv_lora_rank, q_lora_rank=spec.q_lora_rank,
                  qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_d,
                  qk_nope_head_dim=spec.d - spec.qk_rope_head_dim, n_group=spec.router_groups,
                  topk_group=spec.router_group_topk, num_experts_per_tok=spec.experts_per_token,
                  first_k_dense_replace=len(spec.dense_layers), norm_topk_prob=spec.normalize_topk,
                  rms_norm_eps=spec.norm_eps, max_position_embeddings=spec.seq,
                  tie_word_embeddings=spec.tied_embeddings, attn_implementation="eager",
                  experts_implementation="eager")
    if spec.router_score == "sigmoid":
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        return DeepseekV3ForCausalLM(DeepseekV3Config(**common))
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    method = "greedy" if spec.router_groups is None else "group_limited_greedy"
    return DeepseekV2ForCausalLM(DeepseekV2Config(**common, topk_method=method))


def ours_and_theirs(spec: ModelSpec):  # type: ignore[no-untyped-def]
    cfg = get_config(spec)
    layers = [m.double().eval() for m in build_layers(cfg, seed=2)]
    hf = hf_deepseek(spec).double().eval()
    assert sum(p.numel() for p in hf.parameters()) == cfg.total_params()
    return cfg, layers, hf


def _copy(pairs) -> None:  # type: ignore[no-untyped-def]
    for a, b in pairs:
        if a is None:
            assert b is None
            continue
        b.weight.copy_(a.weight)


def copy_attention(ours: LatentAttention, theirs: nn.Module) -> None:
    """Our latent attention into transformers' (the same names); the latents' norms away from one first."""
    with torch.no_grad():
        for norm in (ours.q_a_layernorm, ours.kv_a_layernorm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
        _copy([(getattr(ours, n), getattr(theirs, n)) for n in ("q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj",
                                                                 "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
                                                                 "o_proj")])


def copy_moe(ours: SparseMoE, theirs: nn.Module) -> None:
    """Our router (scaled up: scores far from uniform), its bias (set: V3), experts and shared expert into
    transformers' DeepseekV3MoE / DeepseekV2Moe (experts fused: ``gate_up_proj[e]`` = gate over up)."""
    with torch.no_grad():
        copy_routed_experts(ours, theirs)
        if ours.router.expert_bias is not None:
            ours.router.expert_bias.copy_(torch.randn(len(ours.experts), generator=torch.Generator().manual_seed(9))
                                          * 0.3)
            theirs.gate.e_score_correction_bias.copy_(ours.router.expert_bias)
        se, them = ours.shared_expert, theirs.shared_experts
        _copy([(se.gate, them.gate_proj), (se.up, them.up_proj), (se.down, them.down_proj)])


def copy_block(ours: LlamaBlock, theirs: nn.Module) -> None:
    copy_attention(ours.mla, theirs.self_attn)
    with torch.no_grad():
        for norm in (ours.input_norm, ours.post_norm):  # (tests.test_llama._same_logits copies them)
            norm.weight.uniform_(0.5, 1.5)
        if ours.moe is not None:
            copy_moe(ours.moe, theirs.mlp)
        else:
            mlp = theirs.mlp
            _copy([(ours.gate, mlp.gate_proj), (ours.up, mlp.up_proj), (ours.down, mlp.down_proj)])


def test_modules_as_transformers_builds_them() -> None:
    """The latent attention's modules and shapes are transformers' (no q/k/v/o of standard attention); the router's
    bias is a float32 buffer of zeros (in the state dict, not a parameter), only with router_bias."""
    for spec in SPECS.values():
        _, layers, hf = ours_and_theirs(spec)
        for ours, theirs in zip(layers[1:-1], hf.model.layers, strict=True):
            assert ours.q is None and ours.k is None and ours.v is None and ours.o is None
            mine = {n: p.shape for n, p in ours.mla.named_parameters()}
            assert mine == {n: p.shape for n, p in theirs.self_attn.named_parameters()}
            assert ours.mla.kv_a_layernorm.eps == theirs.self_attn.kv_a_layernorm.variance_epsilon == 1e-6
    moe = build_layers(get_config(V3), seed=1, start=2, stop=3)[0].moe
    assert isinstance(moe.router, Router)
    assert moe.router.expert_bias.dtype == torch.float32 and not moe.router.expert_bias.any()
    assert "router.expert_bias" in moe.state_dict() and "router.expert_bias" not in dict(moe.named_parameters())
    assert build_layers(get_config(V2_GROUP), seed=1, start=2, stop=3)[0].moe.router.expert_bias is None


@pytest.mark.parametrize("name", SPECS)
def test_attention_same_function_as_transformers(name: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Our LatentAttention against transformers' DeepseekV3Attention / DeepseekV2Attention on the same input
    (float64; transformers' latent norms and softmax round through float32, V2's rotary through complex64, hence
    1e-6); with the rotary in the rotate-half layout (the interleaved pairs wrong), or the latent's norm left out,
    it differs by far more."""
    import executor.models.mla as mla
    from executor.models.llama import apply_rotary

    spec = SPECS[name]
    _, layers, hf = ours_and_theirs(spec)
    ours, theirs = layers[1].mla, hf.model.layers[0].self_attn
    with torch.no_grad():  # scores of order one: the positions and the latent's norm weigh in the softmax
        for lin in (ours.q_proj, ours.q_b_proj, ours.kv_b_proj):
            if lin is not None:
                lin.weight.mul_(10)
    copy_attention(ours, theirs)
    x = torch.randn(2, 16, spec.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    mask = torch.full((16, 16), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        rotary = hf.model.rotary_emb(x, torch.arange(16)[None])
        want = theirs(x, position_embeddings=rotary, attention_mask=mask)[0]
        torch.testing.assert_close(ours(x), want, rtol=1e-6, atol=1e-6)
        monkeypatch.setattr(mla, "apply_rotary_interleaved",
                            lambda t, cos, sin: apply_rotary(t, torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)))
        assert (ours(x) - want).abs().max() > 1e-2 * want.abs().max()
        monkeypatch.undo()
        norm, ours.kv_a_layernorm = ours.kv_a_layernorm, nn.Identity()
        ours.kv_a_layernorm.normalized_shape = norm.normalized_shape
        assert (ours(x) - want).abs().max() > 1e-2 * want.abs().max()
        ours.kv_a_layernorm = norm
        torch.testing.assert_close(ours(x), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", SPECS)
def test_router_same_choice_as_transformers(name: str) -> None:
    """Our Router chooses each token's experts as transformers' DeepseekV3TopkRouter / DeepseekV2TopkRouter (the
    same sets) with the same weights; each rule matters: without the groups, without V3's bias, the choice differs
    for some tokens; without the scaling or the renormalisation, the weights."""
    from executor.models.llama import route

    spec = SPECS[name]
    _, layers, hf = ours_and_theirs(spec)
    ours, theirs = layers[2].moe, hf.model.layers[1].mlp
    copy_moe(ours, theirs)
    x = torch.randn(64, spec.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    r = ours.router
    with torch.no_grad():
        weights, index = r.choose(x, x.dtype)
        _, their_weights, their_index = theirs.gate(x)
    order, their_order = index.argsort(dim=-1), their_index.argsort(dim=-1)
    assert torch.equal(index.gather(1, order), their_index.gather(1, their_order))
    # (their router's logits in float32: float32's precision, times the scaling)
    torch.testing.assert_close(weights.gather(1, order), their_weights.gather(1, their_order).double(), rtol=1e-5,
                               atol=1e-5)
    logits = r(x)
    plain = dict(score=r.score, groups=r.groups, group_topk=r.group_topk, bias=r.expert_bias, scaling=r.scaling)
    if r.groups is not None:
        free = route(logits, r.top_k, r.normalize, x.dtype, **{**plain, "groups": None, "group_topk": None})[1]
        assert (free.sort(dim=-1).values != index.sort(dim=-1).values).any(dim=-1).sum() > 3
        groups = index // (spec.experts // r.groups)  # each token's experts within its router_group_topk groups
        assert all(len(set(g)) <= r.group_topk for g in groups.tolist())
    if r.expert_bias is not None:
        unbiased = route(logits, r.top_k, r.normalize, x.dtype, **{**plain, "bias": None})[1]
        assert (unbiased.sort(dim=-1).values != index.sort(dim=-1).values).any(dim=-1).sum() > 3
    total = weights.sum(dim=-1)
    if spec.normalize_topk:
        torch.testing.assert_close(total, torch.full_like(total, spec.routed_scaling))
    else:
        assert total.mean() < 0.98 * spec.routed_scaling  # (softmax: the top 2 of 8 sum to less than one)


@pytest.mark.parametrize("name", SPECS)
def test_same_logits_as_transformers(name: str) -> None:
    """The whole model, its dense layer included: our weights copied into DeepseekV3ForCausalLM /
    DeepseekV2ForCausalLM give the same logits (float64; transformers' norms round through float32, as in
    tests/test_shared_experts_executor.py)."""
    from tests.test_llama import _same_logits

    cfg, layers, hf = ours_and_theirs(SPECS[name])
    _same_logits(cfg, layers, hf, copy_block, tol=1e-5)



@pytest.mark.parametrize("fixture", ["tiny-deepseek-v3", "tiny-deepseek-v2-lite"])
def test_fixture_as_published_same_logits_as_transformers(fixture: str) -> None:
    """tests/fixtures/tiny-deepseek-v3 and tiny-deepseek-v2-lite as published (rms_norm_eps 1e-6, DeepSeek's): our
    layers of the spec profiler.hf_config reads (norm_eps 1e-6) give the logits of DeepseekV3ForCausalLM /
    DeepseekV2ForCausalLM built from the same config.json (float64, every norm's weight off one). The block's and
    the final norms take norm_eps; the latents' keep transformers' fixed 1e-6 (DeepseekV3RMSNorm's default) whatever
    norm_eps is (the hand-built V3 at the 1e-5 default too). With the block's and the final norms at 1e-5 the logits
    differ by far more than the tolerance (about 9e-3)."""
    import transformers

    from tests.test_llama import _same_logits

    path = Path(__file__).resolve().parent / "fixtures" / fixture / "config.json"
    data = json.loads(path.read_text())
    spec = read_hf_config(path, name=fixture)
    assert data.pop("rms_norm_eps") == spec.norm_eps == 1e-6 and spec.mla
    kind = {"deepseek_v3": "DeepseekV3", "deepseek_v2": "DeepseekV2"}[data.pop("model_type")]
    hf = getattr(transformers, f"{kind}ForCausalLM")(getattr(transformers, f"{kind}Config")(
        **data, rms_norm_eps=spec.norm_eps, attn_implementation="eager", experts_implementation="eager"))
    hf = hf.double().eval()
    cfg = get_config(spec)
    layers = [m.double().eval() for m in build_layers(cfg, seed=2)]
    assert sum(p.numel() for p in hf.parameters()) == cfg.total_params()

    def latent(name: str) -> bool:
        return name.endswith(("q_a_layernorm", "kv_a_layernorm"))

    def norms(built: list[nn.Module], latents: bool) -> list[nn.Module]:
        return [m for layer in built for n, m in layer.named_modules()
                if isinstance(m, nn.RMSNorm) and latent(n) == latents]

    assert len(norms(layers, False)) == 2 * spec.layers + 1 and {m.eps for m in norms(layers, False)} == {1e-6}
    assert norms(layers, True) and {m.eps for m in norms(layers, True)} == {1e-6}
    default = build_layers(get_config(V3), seed=2)
    assert V3.norm_eps == 1e-5 and {m.eps for m in norms(default, False)} == {1e-5}
    assert {m.eps for m in norms(default, True)} == {1e-6}
    with torch.no_grad():
        layers[-1].norm.weight.uniform_(0.5, 1.5)  # (_same_logits copies it; the blocks' norms: copy_block)
    _same_logits(cfg, layers, hf, copy_block, tol=1e-5)
    with torch.no_grad():
        ids = synthetic_batch(cfg, 2, seed=3)[0]
        want = hf(ids).logits
        for m in norms(layers, False):
            m.eps = 1e-5
        x = ids
        for m in layers[:-1]:
            x = m(x)
        assert (layers[-1].logits(x) - want).abs().max() > 100 * 1e-5

def test_parameter_counts() -> None:
    """The built model's parameters are ModelSpec.total_params() (transformers' too: ours_and_theirs), each block's
    ModelSpec.block_params(i), its attention's ModelSpec.attention_params()."""
    for spec in (*SPECS.values(), V3.with_(tied_embeddings=True, v_head_dim=None)):
        layers = build_layers(get_config(spec), seed=1)
        assert [sum(p.numel() for p in m.parameters()) for m in layers[1:-1]] == [
            spec.block_params(i) for i in range(spec.layers)]
        assert sum(p.numel() for p in layers[1].mla.parameters()) == spec.attention_params()
        assert sum(p.numel() for p in Stage(layers).parameters()) == spec.total_params()


def test_refusals() -> None:
    """Per-head query/key norms (Qwen3's qk_norm) have no place in latent attention: refused naming the field (by
    ModelSpec: a plan naming such a model too)."""
    with pytest.raises(ValueError, match="qk_norm"):
        V3.with_(qk_norm=True)
    with pytest.raises((PlanError, ValueError), match="qk_norm"):
        RunPlan.direct("1f1b", 1, 2, model=V3.name, model_spec={**V3.model_dump(), "qk_norm": True},
                       iterations=1).validate()


def test_expert_parallel_keeps_the_router_and_its_bias() -> None:
    """ExpertParallelMoE keeps the (replicated) router, its bias buffer and rule with it, on every EP rank."""
    from executor.expert_parallel import ExpertParallelMoE

    moe = build_layers(get_config(V3), seed=1, start=2, stop=3)[0].moe
    with torch.no_grad():
        moe.router.expert_bias.normal_()
    for rank in (0, 1):
        ep = ExpertParallelMoE(copy.deepcopy(moe), rank, 2, None)
        assert torch.equal(ep.router.expert_bias, moe.router.expert_bias)
        assert (ep.router.score, ep.router.groups, ep.router.scaling) == ("sigmoid", 4, 2.5)
        assert "router.expert_bias" in ep.state_dict()


@pytest.mark.slow
def test_tensor_parallel_block_equals_whole_block() -> None:
    """t = 2 (gloo, two processes) against the whole block, float64: the same output, input gradient and parameter
    gradients (the shards' gathered under the whole block's names) for V3's dense and MoE layers (query latent) and
    V2-Lite's dense layer (queries projected directly). Split: q_b_proj / q_proj and kv_b_proj by rows (heads),
    o_proj by columns; the down projections and latents' norms whole. Collectives: forward o_proj's all-reduce of
    T h; backward one of the query latent's gradient (T c'; T h of the input through q_proj's f without one) and one
    of the normed key/value latent and the shared rotated key together (T (c + r)); plus the MLP's."""
    specs = {"v3 dense": (V3.model_dump(), 0), "v3 moe": (V3.model_dump(), 1),
             "v2-lite dense": (V2_LITE.model_dump(), 0)}
    ranks = tp_block_errors(specs)
    T, h, k, c, r, cq = 2 * 16, 64, 2, 32, 8, 48
    for errors in ranks:
        for name, e in errors.items():
            assert_whole_block(name, e)
            attention = {n for n in e["split"] if n.startswith("mla.")}
            query = "mla.q_proj.weight" if name.startswith("v2-lite") else "mla.q_b_proj.weight"
            assert attention == {query, "mla.kv_b_proj.weight", "mla.o_proj.weight"}, (name, e["split"])
            mla = [T * h, T * (c + r), T * h if name.startswith("v2-lite") else T * cq]
            mlp = [T * h] * 2 if "dense" in name else [T * h] * 4 + [T * k]
            assert sorted(e["all-reduces"]) == sorted(mla + mlp), (name, e["all-reduces"])


P = plans_of(V3)


RUNS_2 = {
    "t=2": P("1f1b", 1, 2, tensor=2),
    "t=2 v2-lite": P("1f1b", 1, 2, V2_LITE, tensor=2),
    "e=2 W=2": P("1f1b", 1, 2, data=2, expert=2),
    "e=2 W=2 v2 group-limited softmax": P("1f1b", 1, 2, V2_GROUP, data=2, expert=2),
    "1f1b D=2": P("1f1b", 2, 4),
    "zb-h1 D=2 (split backward)": P("zb-h1", 2, 4),
}
RUNS_4 = {
    "t=2 e=2 W=2": P("1f1b", 1, 2, data=2, expert=2, tensor=2),
}


runs = launched_fixture((RUNS_2, 2), (RUNS_4, 4))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS_2, *RUNS_4])
def test_run_equals_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    """Real runs (gloo, float64) with --check: the parameters after two steps equal single-process training's, the
    latent attention's (gathered from its shards at t = 2, whole on every copy of the replicated ones) and the
    experts' under DeepSeek's routing included."""
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]
