"""A mixture of experts in the planner: parameters, the operator model (planner.moe), the analytical profile, a
search over it and the exports."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from planner.analytic import analytic_profile
from planner.device import get_device
from planner.model import ModelSpec
from planner.moe import tokens_per_expert
from planner.operators import OperatorOptions, layer_operators, time_operators

MIXTRAL = ModelSpec(name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_mlp=True,
                    activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False,
                    vocab=32000, seq=4096, rope_theta=1e6, experts=8, experts_per_token=2)
QWEN3_MOE = ModelSpec(name="qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
                      ffn_hidden=6144, expert_ffn_hidden=768, gated_mlp=True, activation="silu", norm="rmsnorm",
                      position="rotary", tied_embeddings=False, bias=False, qk_norm=True, vocab=151936, seq=4096,
                      experts=128, experts_per_token=8)
H100 = get_device("H100-SXM5-80GB")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FLASH = OperatorOptions(attention="flash", causal=True, dropout=False)


def dense_twin(spec: ModelSpec) -> ModelSpec:
    """The dense layer a token sees: one MLP as wide as its k experts together."""
    return spec.with_(experts=None, experts_per_token=None, expert_ffn_hidden=None,
                      ffn_hidden=spec.f_e * int(spec.experts_per_token or 1))


def gemm_flops(ops, names=None) -> float:  # noqa: ANN001
    return sum(k.flops for op in ops if names is None or op.name in names for k in op.fwd if k.gemm is not None)


def test_published_parameter_counts():
    """Mixtral 8x7B: 46.7B parameters, 12.9B active per token (Jiang et al. 2024, section 2); Qwen3-30B-A3B: 30.5B,
    3.3B activated (its model card: the 3.35B of one token's path, embeddings included)."""
    assert MIXTRAL.total_params() == 46_702_792_704
    active = (MIXTRAL.embedding_params() + MIXTRAL.head_params() + MIXTRAL.layers * (
        MIXTRAL.attention_params() + MIXTRAL.active_mlp_params() + 2 * MIXTRAL.norm_params()))
    assert round(active / 1e9, 1) == 12.9
    assert QWEN3_MOE.total_params() == 30_532_122_624
    q = QWEN3_MOE
    active = q.embedding_params() + q.head_params() + q.layers * (
        q.attention_params() + q.active_mlp_params() + 2 * q.norm_params() + 2 * q.d)
    assert 3.3e9 <= active < 3.4e9  # ("3.3B activated", embeddings included)


@pytest.mark.parametrize("field", [{"experts": 8}, {"experts_per_token": 2}, {"experts": 4, "experts_per_token": 5},
                                   {"expert_ffn_hidden": 64}])
def test_inconsistent_experts_are_refused(field):
    with pytest.raises(ValueError, match="expert"):
        ModelSpec(layers=2, hidden=64, heads=4, vocab=100, seq=16, **field)


@pytest.mark.parametrize("spec", [MIXTRAL, QWEN3_MOE], ids=["mixtral", "qwen3-moe"])
@pytest.mark.parametrize("t", [1, 2, 4])
def test_expert_gemms_are_the_dense_twins_plus_the_router(spec, t):
    """The experts' GEMMs do the FLOPs of a dense MLP k experts wide (balanced routing, T k / E tokens each, where
    that divides), and the router adds 2 T h E; the rest of the layer is the dense layer's."""
    b = 1
    T = b * spec.seq
    assert (T * spec.experts_per_token) % spec.experts == 0
    moe = layer_operators(spec, b, t, FLASH)
    dense = layer_operators(dense_twin(spec), b, t, FLASH)
    assert gemm_flops(moe, {"experts_up", "experts_down"}) == pytest.approx(
        gemm_flops(dense, {"mlp_up_gate", "mlp_down"}))
    assert gemm_flops(moe, {"router"}) == 2.0 * T * spec.hidden * spec.experts
    # the attention side is untouched
    assert gemm_flops(moe) - gemm_flops(moe, {"experts_up", "experts_down", "router"}) == pytest.approx(
        gemm_flops(dense) - gemm_flops(dense, {"mlp_up_gate", "mlp_down"}))


def test_stash_counts_every_copy_of_a_token():
    """Each token's k copies are stashed where the experts read them (the grouped GEMMs' inputs, the activation's
    two inputs, the combine's expert outputs), k times the dense twin's MLP tensors of width f_e."""
    spec, b, t, el = MIXTRAL, 1, 2, 2
    T, k, h, f_t = b * spec.seq, spec.experts_per_token, spec.hidden, spec.f_e // 2
    ops = {op.name: op for op in layer_operators(spec, b, t, FLASH)}
    assert ops["experts_up"].saved_bytes == el * T * k * h
    assert ops["experts_act"].saved_bytes == el * 2 * T * k * f_t
    assert ops["experts_down"].saved_bytes == el * T * k * f_t
    assert ops["combine"].saved_bytes == el * T * k * h
    assert ops["routing"].saved_bytes >= 4 * T * spec.experts  # the fp32 probabilities


def test_sequential_experts_pay_per_launch():
    """A loop over 128 small experts launches each kernel 128 times: slower than one grouped GEMM, and more so
    where each expert's GEMM is smaller (t = 4 splits them further); Mixtral's 8 large experts differ little."""
    def fwd(spec: ModelSpec, gem: str, t: int) -> float:
        opts = OperatorOptions(attention="flash", causal=True, dropout=False, expert_gemm=gem)
        return time_operators(layer_operators(spec, 1, t, opts), H100, "bf16").fwd

    for t in (1, 4):
        assert fwd(QWEN3_MOE, "sequential", t) > 1.5 * fwd(QWEN3_MOE, "grouped", t)
    assert fwd(QWEN3_MOE, "sequential", 4) / fwd(QWEN3_MOE, "grouped", 4) > \
        fwd(QWEN3_MOE, "sequential", 1) / fwd(QWEN3_MOE, "grouped", 1)
    assert fwd(MIXTRAL, "sequential", 1) < 1.1 * fwd(MIXTRAL, "grouped", 1)
    ops = layer_operators(QWEN3_MOE, 1, 1, OperatorOptions(expert_gemm="sequential"))
    up = next(op for op in ops if op.name == "experts_up")
    assert len(up.fwd) == QWEN3_MOE.experts and up.fwd[0].gemm == (tokens_per_expert(4096, QWEN3_MOE), 2 * 768, 2048, 1)


def test_grouped_weight_gradients_accumulate_every_expert():
    """With separate gradient accumulation each expert's weight gradient is added into its main gradient: a grouped
    GEMM's accumulation kernel moves all E experts' weights (3 el per weight)."""
    ops = {op.name: op for op in layer_operators(MIXTRAL, 1, 1, OperatorOptions(grad_accumulation="separate"))}
    acc = next(k for k in ops["experts_down"].bwd_w if k.name.endswith("grad_acc"))
    assert acc.nbytes == 3 * 2 * MIXTRAL.experts * MIXTRAL.hidden * MIXTRAL.f_e


def test_tokens_per_expert_rounds_up():
    assert tokens_per_expert(4096, MIXTRAL) == 1024
    odd = MIXTRAL.with_(experts=3, experts_per_token=2)
    assert tokens_per_expert(100, odd) == math.ceil(200 / 3)


def test_analytic_profile_of_a_mixture_of_experts():
    """Every expert's parameters are in each block (its expert_params), with times at every expert-parallel size
    dividing E, the profile says what its times assume, and a dense profile's environment is as before (no
    expert_gemm)."""
    prof = analytic_profile(MIXTRAL, H100, micro_batches=(1, 2), options=FLASH)
    assert sum(lay.params for lay in prof.layers) == MIXTRAL.total_params()
    assert prof.layers[1].params == MIXTRAL.layer_params()
    assert prof.environment["expert_gemm"] == "grouped"
    assert "8 experts, 2 per token, balanced routing" in prof.notes
    assert "times at every expert-parallel size dividing 8" in prof.notes
    assert prof.layers[1].expert_params == 8 * MIXTRAL.expert_params() and prof.layers[0].expert_params == 0
    assert sorted(prof.layers[1].expert_times) == [2, 4, 8] and prof.layers[0].expert_times is None
    assert (prof.shape.experts, prof.shape.experts_per_token) == (8, 2)
    dense = analytic_profile(dense_twin(MIXTRAL), H100, micro_batches=(1,), options=FLASH)
    assert "expert_gemm" not in dense.environment and "experts" not in dense.notes
    assert all(not lay.expert_params and lay.expert_times is None for lay in dense.layers)
    assert "experts" not in dense.shape.model_dump()
    # per t: the shard's times fall with t, the router and routing do not split
    times = {t: prof.layers[1].tensor_times[t].fwd_time[1] for t in (1, 2, 8)}
    assert times[1] > times[2] > times[8] > times[1] / 8


def test_search_over_a_mixture_of_experts_counts_all_experts_in_memory():
    """A plan of Mixtral on 64 H100s: every candidate's model state holds all experts of its stages, or with expert
    parallelism ``1/e`` of them (a configuration whose t D e cannot hold the state is rejected on it); expert-parallel
    rows are among the best."""
    from planner.cluster import load_cluster
    from planner.device import device_for_cluster
    from planner.request import TrainingRequest
    from planner.search import plan
    cl = load_cluster(EXAMPLES / "clusters" / "dgx-h100-80gb.json")
    prof = analytic_profile(MIXTRAL, device_for_cluster(cl), micro_batches=(1, 2), options=FLASH)
    res = plan(prof, cl, TrainingRequest(global_batch=256, gpus=64, top=3))
    assert res.candidates
    experts = MIXTRAL.layers * 8 * MIXTRAL.expert_params()
    for c in res.candidates:
        held = MIXTRAL.total_params() - experts + experts / c.config.expert
        per_device = 16 * held / (c.config.tensor * c.config.pipeline)
        assert max(c.memory) > 0.9 * per_device  # (16 bytes per parameter: weights, gradients, Adam state)
    assert res.rejected["weights, gradients and optimizer state do not fit"] > 0
    assert any(c.config.expert > 1 for c in res.candidates)


def test_megatron_export_writes_the_experts():
    from planner.export.common import ExportInput
    from planner.export.megatron import arguments
    from planner.request import Config
    from planner.runspec import RunSpec

    spec = RunSpec(config=Config(tensor=2, pipeline=4, data=2, micro_batch=1, schedule="1f1b", recompute=False),
                   microbatches=16)
    notes: list[str] = []
    args = arguments(ExportInput(spec=spec, model=QWEN3_MOE.with_(normalize_topk=False), expert_gemm="grouped",
                                 sequence_parallel=False), notes)
    line = " ".join(args)
    assert "--num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 --expert-model-parallel-size 1" in line
    assert "--moe-router-pre-softmax" in args and "--moe-grouped-gemm" in args
    assert any("--sequence-parallel" in n for n in notes)
    assert not any("in each MLP" in n for n in notes)  # written, so not a gap


def test_torchtitan_export_notes_the_experts_it_does_not_write():
    from planner.export.common import model_gaps_note

    note = model_gaps_note(MIXTRAL, "torchtitan", "llama3 model settings")
    assert note is not None and "a mixture of 8 experts (2 per token)" in note
    assert model_gaps_note(MIXTRAL, "megatron", "Llama-shaped arguments", experts=True) is None
