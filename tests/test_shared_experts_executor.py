"""Shared experts and dense layers in the executor's mixture of experts (executor/models/llama.py's SparseMoE and
LlamaBlock; planner/model.py's shared_expert_ffn_hidden, shared_expert_gate, dense_layers): a tiny Qwen2-MoE-like
model computes what transformers' Qwen2MoeForCausalLM does with the same weights (float64), gated shared expert or
not, its dense layers dense; its parameter count is ModelSpec's; a block at t = 2 (its shared expert split as the
dense MLP, with its own collectives, the gate replicated) equals the whole block; under expert parallelism the shared
expert is no expert (replicated, reduced as any dense parameter); and runs at t = 2, e = 2 (also with t = 2) and with
a 2-stage pipeline equal single-process training (gloo, float64)."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_parity import copy_routed_experts
from run_support import assert_whole_block, launched_fixture, plans_of, tp_block_errors
from torch import nn

from executor.models import Stage, build_layers, get_config
from executor.models.llama import LlamaBlock, SparseMoE, route
from executor.plan import PlanError, RunPlan
from planner.model import ModelSpec

torch.set_num_threads(1)

#: Qwen1.5-MoE's form, tiny: q/k/v biases, 4 experts of 32, top-2 not renormalised, a gated shared expert of 48,
#: transformer layer 1 dense (ffn_hidden 96)
QWEN2_MOE = ModelSpec(name="tiny-qwen2-moe", layers=3, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, gated_mlp=True,
                      activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False,
                      qkv_bias=True, vocab=128, seq=16, experts=4, experts_per_token=2, expert_ffn_hidden=32,
                      shared_expert_ffn_hidden=48, shared_expert_gate=True, normalize_topk=False, dense_layers=(1,))
#: the shared expert without its gate (DeepSeekMoE's), layer 0 dense
UNGATED = QWEN2_MOE.with_(name="tiny-moe-ungated", shared_expert_gate=False, dense_layers=(0,))
#: MLPs with biases and no gate (the shared expert's down bias after its all-reduce at t = 2)
BIASED = QWEN2_MOE.with_(name="tiny-moe-biased", gated_mlp=False, bias=True, activation="gelu")


def hf_qwen2_moe(spec: ModelSpec):  # type: ignore[no-untyped-def]
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    return Qwen2MoeForCausalLM(Qwen2MoeConfig(
        hidden_size=spec.hidden, intermediate_size=spec.f, moe_intermediate_size=spec.f_e,
        shared_expert_intermediate_size=spec.shared_expert_ffn_hidden, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.k, vocab_size=spec.vocab,
        num_experts=spec.experts, num_experts_per_tok=spec.experts_per_token, norm_topk_prob=spec.normalize_topk,
        mlp_only_layers=list(spec.dense_layers), decoder_sparse_step=1, qkv_bias=spec.qkv_bias,
        rms_norm_eps=spec.norm_eps, rope_theta=spec.rope_theta, max_position_embeddings=spec.seq,
        tie_word_embeddings=spec.tied_embeddings,
        attn_implementation="eager", experts_implementation="eager"))


class _Open(nn.Module):
    """Stands in for transformers' ``shared_expert_gate`` on a model without one: ``sigmoid(inf) = 1``, exactly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_full((*x.shape[:-1], 1), float("inf"))


def ours_and_theirs(spec: ModelSpec):  # type: ignore[no-untyped-def]
    cfg = get_config(spec)
    layers = [m.double().eval() for m in build_layers(cfg, seed=2)]
    hf = hf_qwen2_moe(spec).double().eval()
    # transformers always builds the gate (h per MoE layer); without one ours has none
    gates = 0 if spec.shared_expert_gate else spec.moe_layers * spec.hidden
    assert sum(p.numel() for p in hf.parameters()) - gates == cfg.total_params()
    if not spec.shared_expert_gate:
        for layer in hf.model.layers:
            if hasattr(layer.mlp, "shared_expert_gate"):
                layer.mlp.shared_expert_gate = _Open()
    return cfg, layers, hf


def _copy_linears(pairs) -> None:  # type: ignore[no-untyped-def]
    for a, b in pairs:
        b.weight.copy_(a.weight)
        if a.bias is not None:
            b.bias.copy_(a.bias)


def copy_moe(ours: SparseMoE, theirs: nn.Module) -> None:
    """Our router, experts, shared expert and gate into transformers' Qwen2MoeSparseMoeBlock (its experts fused:
    ``gate_up_proj[e]`` = gate over up). The router and the gate scaled up first: a routing far from uniform, a gate
    far from one half (and from one)."""
    with torch.no_grad():
        copy_routed_experts(ours, theirs)
        se, them = ours.shared_expert, theirs.shared_expert
        _copy_linears([(se.gate, them.gate_proj), (se.up, them.up_proj), (se.down, them.down_proj)])
        if ours.shared_expert_gate is not None:
            ours.shared_expert_gate.weight.mul_(50)
            theirs.shared_expert_gate.weight.copy_(ours.shared_expert_gate.weight)


def copy_block(ours: LlamaBlock, theirs: nn.Module) -> None:
    at = theirs.self_attn
    _copy_linears([(ours.q, at.q_proj), (ours.k, at.k_proj), (ours.v, at.v_proj), (ours.o, at.o_proj)])
    for norm, target in ((ours.input_norm, theirs.input_layernorm), (ours.post_norm, theirs.post_attention_layernorm)):
        norm.weight.uniform_(0.5, 1.5)  # norms at one would hide a norm applied in the wrong place
        target.weight.copy_(norm.weight)
    if ours.moe is not None:
        copy_moe(ours.moe, theirs.mlp)
    else:  # a dense layer: transformers' Qwen2MoeMLP of intermediate_size
        mlp = theirs.mlp
        _copy_linears([(ours.gate, mlp.gate_proj), (ours.up, mlp.up_proj), (ours.down, mlp.down_proj)])


def test_dense_layers_are_built_dense() -> None:
    """The layers in dense_layers get the dense MLP of width ffn_hidden (no SparseMoE), the others a SparseMoE with
    its shared expert of width shared_expert_ffn_hidden and, gated, its gate (1, h) without bias; as transformers
    builds them (mlp_only_layers)."""
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeMLP, Qwen2MoeSparseMoeBlock

    for spec in (QWEN2_MOE, UNGATED):
        cfg, layers, hf = ours_and_theirs(spec)
        for i, (ours, theirs) in enumerate(zip(layers[1:-1], hf.model.layers, strict=True)):
            if i in spec.dense_layers:
                assert ours.moe is None and ours.up.weight.shape == (spec.f, spec.hidden)
                assert isinstance(theirs.mlp, Qwen2MoeMLP)
            else:
                assert isinstance(ours.moe, SparseMoE) and ours.up is None and ours.gate is None and ours.down is None
                assert isinstance(theirs.mlp, Qwen2MoeSparseMoeBlock)
                assert ours.moe.shared_expert.up.weight.shape == (spec.shared_expert_ffn_hidden, spec.hidden)
                gate = ours.moe.shared_expert_gate
                assert (gate is not None) == spec.shared_expert_gate
                if gate is not None:
                    assert gate.weight.shape == (1, spec.hidden) and gate.bias is None


@pytest.mark.parametrize("spec", [QWEN2_MOE, UNGATED], ids=["gated shared expert", "shared expert without gate"])
def test_moe_layer_same_function_as_transformers(spec: ModelSpec) -> None:
    """Our SparseMoE with its shared expert against transformers' Qwen2MoeSparseMoeBlock on the same tokens,
    float64, to 1e-12; without the gate, or with it left out, or without the shared expert, it differs by far more."""
    _, layers, hf = ours_and_theirs(spec)
    i = next(i for i in range(spec.layers) if spec.moe_layer(i))
    ours, theirs = layers[1 + i].moe, hf.model.layers[i].mlp
    copy_moe(ours, theirs)
    x = torch.randn(3, 16, spec.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = theirs(x)
        torch.testing.assert_close(ours(x), want, rtol=1e-12, atol=1e-12)
        shared = ours.shared_expert
        if ours.shared_expert_gate is not None:  # the gate matters: sigmoid(x w) far from one and from one half
            score = torch.sigmoid(ours.shared_expert_gate(x))
            assert score.min() < 0.2 and score.max() > 0.8
            gate, ours.shared_expert_gate = ours.shared_expert_gate, None
            assert (ours(x) - want).abs().max() > 1e-3
            ours.shared_expert_gate = gate
        ours.shared_expert = None
        assert (ours(x) - want).abs().max() > 1e-3
        ours.shared_expert = shared
    weights, index = route(ours.router(x.view(-1, spec.hidden)), ours.top_k, ours.normalize, x.dtype)
    assert set(index.unique().tolist()) == set(range(int(spec.experts)))
    assert weights.sum(dim=-1).mean() < 0.95  # not renormalised (Qwen2 MoE's norm_topk_prob False)


@pytest.mark.parametrize("spec", [QWEN2_MOE, UNGATED], ids=["gated shared expert", "shared expert without gate"])
def test_same_logits_as_transformers(spec: ModelSpec) -> None:
    """The whole model, its dense layer included: our weights copied into Qwen2MoeForCausalLM give the same logits
    (float64; transformers' RMSNorm rounds through float32, hence float32's tolerance, as in
    tests/test_moe_executor.py)."""
    from tests.test_llama import _same_logits

    cfg, layers, hf = ours_and_theirs(spec)
    _same_logits(cfg, layers, hf, copy_block, tol=1e-5)


def test_parameter_counts() -> None:
    """The built model's parameters are ModelSpec.total_params() (shared expert, its gate, the dense layers), each
    block's ModelSpec.block_params(i); with biases and no gate on the MLPs too."""
    for spec in (QWEN2_MOE, UNGATED, BIASED, QWEN2_MOE.with_(dense_layers=(0, 2), tied_embeddings=True)):
        cfg = get_config(spec)
        layers = build_layers(cfg, seed=1)
        assert [sum(p.numel() for p in m.parameters()) for m in layers[1:-1]] == [
            spec.block_params(i) for i in range(spec.layers)]
        assert sum(p.numel() for p in Stage(layers).parameters()) == spec.total_params()
        assert spec.layer_params(True) - spec.layer_params(False) > 0  # the two kinds of layer differ
        moe = next(m.moe for m in layers[1:-1] if m.moe is not None)
        assert sum(p.numel() for p in moe.shared_expert.parameters()) + (
            spec.hidden if spec.shared_expert_gate else 0) == spec.shared_expert_params()


def test_expert_parallel_shared_expert_is_no_expert() -> None:
    """ExpertParallelMoE at e = 2 keeps the shared expert and its gate whole on each EP rank, under the whole
    layer's names; expert_parameters (reduced over the expert-data group only) holds the local experts' parameters
    and not theirs."""
    from executor.expert_parallel import ExpertParallelMoE, expert_parameters

    moe = build_layers(get_config(QWEN2_MOE), seed=1, start=1, stop=2)[0].moe
    for rank in (0, 1):
        ep = ExpertParallelMoE(copy.deepcopy(moe), rank, 2, None)
        names = dict(ep.named_parameters())
        shared = {n for n in names if n.startswith("shared_expert")}
        assert shared == {"shared_expert.gate.weight", "shared_expert.up.weight", "shared_expert.down.weight",
                          "shared_expert_gate.weight"}
        for n in shared:
            torch.testing.assert_close(names[n], dict(moe.named_parameters())[n])
        ids = {id(p) for p in expert_parameters(ep)}
        assert ids == {id(p) for n, p in names.items() if n.startswith("experts.")}
        assert sorted({n.split(".")[1] for n in names if n.startswith("experts.")}) == [str(2 * rank),
                                                                                       str(2 * rank + 1)]
        assert not ids & {id(names[n]) for n in shared}


def test_tensor_parallel_plan_needs_t_to_divide_every_mlp_width() -> None:
    """At t = 2 every MLP is split by columns: the shared expert's width, and the dense layers' ffn_hidden when the
    model has dense layers, must be even (ffn_hidden without dense layers is unused and need not)."""
    def plan(spec: ModelSpec) -> RunPlan:
        return RunPlan.direct("1f1b", 1, 2, tensor=2, model=spec.name, model_spec=spec.model_dump(), iterations=1)

    with pytest.raises(PlanError, match=r"shared expert's MLP width \(49\)"):
        plan(QWEN2_MOE.with_(shared_expert_ffn_hidden=49)).validate()
    with pytest.raises(PlanError, match=r"the MLP width \(97\)"):
        plan(QWEN2_MOE.with_(ffn_hidden=97)).validate()
    plan(QWEN2_MOE.with_(ffn_hidden=97, dense_layers=())).validate()
    plan(QWEN2_MOE).validate()


@pytest.mark.slow
def test_tensor_parallel_block_equals_whole_block() -> None:
    """t = 2 (gloo, two processes) against the whole block, float64: the same output, input gradient and parameter
    gradients (the shards' gathered under the whole block's names) for a layer with a gated shared expert, one
    without the gate, one with biases, and a dense layer of the mixture of experts. Collectives: the shared expert's
    own all-reduce of T h forward and of its input's gradient backward (Megatron-Core's SharedExpertMLP, as the
    planner charges it), none for the gate (replicated, on the whole input and output)."""
    specs = {"gated shared expert": (QWEN2_MOE.model_dump(), 0),
             "shared expert without gate": (UNGATED.model_dump(), 1),
             "biases, no gated MLP": (BIASED.model_dump(), 2),
             "dense layer": (QWEN2_MOE.model_dump(), 1)}
    ranks = tp_block_errors(specs)
    for errors in ranks:
        for name, e in errors.items():
            assert_whole_block(name, e)
            T, h, k = 2 * 16, 64, 2
            if name == "dense layer":
                assert not any(n.startswith("moe.") for n in e["names"])
                assert sorted(e["all-reduces"]) == [T * h] * 4
            else:
                assert "moe.shared_expert.up.weight" in e["names"]
                gated = specs[name][0].get("shared_expert_gate", False)
                assert ("moe.shared_expert_gate.weight" in e["names"]) == gated
                assert sorted(e["all-reduces"]) == sorted([T * h] * 6 + [T * k]), (name, e["all-reduces"])


P = plans_of(QWEN2_MOE)


RUNS_2 = {
    "t=2": P("1f1b", 1, 2, tensor=2),
    "t=2 biases, no gated MLP": P("1f1b", 1, 2, BIASED, tensor=2),
    "e=2 W=2": P("1f1b", 1, 2, data=2, expert=2),
    "e=2 W=2 shared expert without gate": P("1f1b", 1, 2, UNGATED, data=2, expert=2),
    "1f1b D=2 (dense and MoE layers on different stages)": P("1f1b", 2, 4),
}
RUNS_4 = {
    "t=2 e=2 W=2": P("1f1b", 1, 2, data=2, expert=2, tensor=2),
}


runs = launched_fixture((RUNS_2, 2), (RUNS_4, 4))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS_2, *RUNS_4])
def test_run_equals_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    """Real runs (gloo, float64) with --check: the parameters after two steps equal single-process training's, the
    shared experts' and gates' included (every copy of them, on every EP and tensor rank)."""
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]
