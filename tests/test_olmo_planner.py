"""OLMo 2, OLMo 3 and OLMoE in the planner (``ModelSpec.qk_norm_scope`` projection: the query and key norms over the
whole projections; ``post_norm``: each branch's output normed, not its input): the rules and counts, the Hugging Face
configs (each count equal to transformers' model), the operator model, the tensor-parallel all-reduces of the split
norms and a plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moe_support import H100, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.model import ModelSpec
from planner.operators import OperatorOptions, layer_operators
from planner.request import Config, TrainingRequest
from planner.search import Planner, plan
from profiler.hf_config import HFConfigError, read_hf_config, spec_from_hf_dict

ROOT = Path(__file__).resolve().parent.parent
MODELS, FIXTURES = ROOT / "examples" / "models", ROOT / "tests" / "fixtures"
#: OLMo 2 7B's layer shape, 4 layers
OLMO2 = ModelSpec(name="olmo2-4l", layers=4, hidden=4096, heads=32, ffn_hidden=11008, gated_mlp=True, activation="silu",
                  norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False, qk_norm=True,
                  qk_norm_scope="projection", post_norm=True, vocab=100352, seq=4096, rope_theta=500000.0)
FUSED = OperatorOptions(attention="flash", causal=True, dropout=False)
EAGER = OperatorOptions(attention="flash", causal=True, dropout=False, kernels="eager")


@pytest.mark.parametrize(("changes", "words"), [
    ({"qk_norm": False}, "qk_norm_scope: only with qk_norm"),
    ({"sandwich_norm": True}, "post_norm: not with sandwich_norm"),
    ({"qk_norm_scope": "layer"}, "qk_norm_scope"),
])
def test_rules_name_the_field(changes: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        OLMO2.with_(**changes)


def test_counts_and_record() -> None:
    """The projection norms hold ``a d + k d`` weights (per head: ``2d``); post-norm keeps two norms a layer; the new
    fields are left out of a record that does not use them."""
    per_head = OLMO2.with_(qk_norm_scope="head", post_norm=False)
    assert OLMO2.qk_norm_params() == 2 * 4096 and per_head.qk_norm_params() == 2 * 128
    assert OLMO2.layer_params() - per_head.layer_params() == 2 * 4096 - 2 * 128
    assert OLMO2.norms_per_layer == 2
    assert not {"qk_norm_scope", "post_norm"} & set(per_head.model_dump())
    assert ModelSpec.model_validate_json(OLMO2.model_dump_json()) == OLMO2


def test_hf_configs() -> None:
    """OLMo 2 7B (Team OLMo 2024, "2 OLMo 2 Furious", Table 1: 7.30B), OLMoE-1B-7B (Muennighoff et al. 2024,
    "OLMoE", Table 1: 6.9B total, 1.3B active; 64 experts of 1024, top 8, not renormalised) and a tiny OLMo 3 (its
    windows from layer_types): each count equals transformers' own model's (checked on the meta device:
    7,298,617,344 and 6,919,161,856; the fixtures' 109,280, 140,224 and 91,136)."""
    olmo2 = read_hf_config(MODELS / "olmo-2-7b")
    assert olmo2.total_params() == 7_298_617_344
    assert olmo2.qk_norm and olmo2.qk_norm_scope == "projection" and olmo2.post_norm and not olmo2.bias
    olmoe = read_hf_config(MODELS / "olmoe-1b-7b")
    assert olmoe.total_params() == 6_919_161_856 and not olmoe.post_norm and olmoe.qk_norm_scope == "projection"
    assert (olmoe.experts, olmoe.experts_per_token, olmoe.f_e, olmoe.normalize_topk) == (64, 8, 1024, False)
    active = olmoe.total_params() - olmoe.moe_layers * (olmoe.mlp_params() - olmoe.active_mlp_params())
    assert active == 1_282_017_280
    olmo3 = read_hf_config(FIXTURES / "tiny-olmo3")
    assert (olmo3.sliding_window, olmo3.global_every, olmo3.post_norm) == (4, 4, True)
    assert [read_hf_config(FIXTURES / f).total_params() for f in ("tiny-olmo2", "tiny-olmo3", "tiny-olmoe")] == [
        109_280, 140_224, 91_136]
    data = json.loads((FIXTURES / "tiny-olmoe" / "config.json").read_text())
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict({**data, "clip_qkv": 8.0}, "c")
    assert err.value.field == "clip_qkv" and "not modelled" in err.value.message


def _names(spec: ModelSpec, options: OperatorOptions) -> list[str]:
    return [op.name for op in layer_operators(spec, 1, 1, options)]


def test_post_norm_moves_the_norms_to_the_outputs() -> None:
    """Post-norm: the projections read the residual stream (no norm1, no norm2) and each branch's output is normed
    before its add; the same number of norms, fused or eager."""
    pre = OLMO2.with_(post_norm=False)
    for options in (FUSED, EAGER):
        post, before = _names(OLMO2, options), _names(pre, options)
        assert "norm1" not in post and "norm2" not in post
        assert post.index("post_attn_norm") == post.index("proj") + 1
        assert post.index("post_mlp_norm") == post.index("dropout_add2") - 1
        assert "norm1" in before and "post_attn_norm" not in before
        assert sum("norm" in n and n != "qk_norm" for n in post) == sum("norm" in n and n != "qk_norm" for n in before)


def _costs(spec: ModelSpec, t: int):  # type: ignore[no-untyped-def]
    prof = analytic_profile(spec, H100, options=FUSED, micro_batches=(1,), tensor_sizes=(1, t))
    planner = Planner(prof, h100_cluster(), TrainingRequest(global_batch=8, gpus=t))
    cand, costs = planner.prepare(Config(tensor=t, pipeline=1, data=1, micro_batch=1, schedule="1f1b"))
    assert costs is not None, cand.reason
    return prof, costs


def test_projection_norms_cost_their_all_reduces_at_t() -> None:
    """At t > 1 each layer all-reduces the rows' fp32 sums of squares of its two projection norms once per pass
    (latency-bound: microseconds each); at t = 1 nothing, and per-head norms nothing at any t."""
    prof, proj = _costs(OLMO2, 4)
    head_prof, head = _costs(OLMO2.with_(qk_norm_scope="head"), 4)
    assert prof.shape is not None and prof.shape.split_norms == 2
    assert head_prof.shape is not None and head_prof.shape.split_norms == 0
    one = proj._tp_allreduce(4096 * 4.0)  # 4096 rows' fp32 sums
    assert 0 < one < 1e-4
    assert proj._tp_comm(0, 1) - head._tp_comm(0, 1) == pytest.approx(4 * 2 * one)  # 4 layers, 2 norms
    assert _costs(OLMO2, 1)[1]._split_norms(1) == 0.0


def test_replicated_key_heads_need_no_key_norm_all_reduce() -> None:
    """Where t does not divide the key/value heads every rank computes the whole key projection (replicated key rows,
    executor.tensor_parallel), so only the query norm all-reduces: one all-reduce per layer and pass, not two."""
    gqa = OLMO2.with_(kv_heads=2)
    prof, costs = _costs(gqa, 4)
    assert prof.shape is not None and (prof.shape.split_norms, prof.shape.kv_heads) == (2, 2)
    one = costs._tp_allreduce(4096 * 4.0)
    assert costs._split_norms(1) == pytest.approx(one)
    assert _costs(gqa, 2)[1]._split_norms(1) == pytest.approx(2 * _costs(gqa, 2)[1]._tp_allreduce(4096 * 4.0))
    assert _costs(OLMO2, 4)[1]._split_norms(1) == pytest.approx(2 * one)


def test_plan_olmoe() -> None:
    """OLMoE-1B-7B's analytical profile holds its parameters and the search plans it with its experts split."""
    spec = read_hf_config(MODELS / "olmoe-1b-7b", seq=4096)
    prof = analytic_profile(spec, H100, options=OperatorOptions(attention="flash", causal=True, dropout=False,
                                                                sequence_parallel=True), micro_batches=(1,))
    assert prof.total_params == spec.total_params()
    res = plan(prof, h100_cluster(), TrainingRequest(global_batch=256, gpus=16, top=3))
    assert res.candidates and {c.config.expert for c in res.candidates} - {1}
