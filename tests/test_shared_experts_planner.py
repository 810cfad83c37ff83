"""Shared experts and dense layers in a mixture of experts (``ModelSpec.shared_expert_ffn_hidden``,
``shared_expert_gate``, ``dense_layers``): the spec's rules and counts, the operator model, the analytical profile and
the tensor-parallel collectives the cost model charges for a shared expert."""

from __future__ import annotations

import pytest
from moe_support import FLASH, H100, QWEN3_MOE, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.model import ModelSpec
from planner.operators import OperatorOptions, layer_operators
from planner.request import Config, TrainingRequest
from planner.search import Planner, plan

#: Qwen1.5-MoE-A2.7B's layer (60 experts of 1408, top 4, a gated shared expert of 5632, Qwen2's biased q/k/v) with 4
#: layers, the first dense
QWEN2_MOE = ModelSpec(name="qwen2-moe-4l", layers=4, hidden=2048, heads=16, ffn_hidden=5632, expert_ffn_hidden=1408,
                      gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False,
                      bias=False, qkv_bias=True, vocab=151936, seq=4096, experts=60, experts_per_token=4,
                      normalize_topk=False, shared_expert_ffn_hidden=5632, shared_expert_gate=True, dense_layers=(0,))
#: the changes that make QWEN2_MOE dense
NO_EXPERTS = {"experts": None, "experts_per_token": None, "expert_ffn_hidden": None, "shared_expert_ffn_hidden": None,
              "shared_expert_gate": False, "dense_layers": ()}
SP = OperatorOptions(attention="flash", causal=True, dropout=False, sequence_parallel=True)


@pytest.mark.parametrize(("changes", "words"), [
    ({**NO_EXPERTS, "shared_expert_ffn_hidden": 64}, "shared_expert_ffn_hidden: only with experts"),
    ({**NO_EXPERTS, "dense_layers": (0,)}, "dense_layers: only with experts"),
    ({"shared_expert_ffn_hidden": None, "shared_expert_gate": True}, "shared_expert_gate: only with a shared expert"),
    ({"dense_layers": (4,)}, "dense_layers: 4 is not a transformer layer (0 to 3)"),
    ({"dense_layers": (-1,)}, "dense_layers: -1 is not a transformer layer"),
    ({"dense_layers": (1, 1)}, "dense_layers: a layer is listed twice"),
    ({"dense_layers": (0, 1, 2, 3)}, "dense_layers: every layer is dense"),
    ({"shared_expert_ffn_hidden": 0}, "shared_expert_ffn_hidden"),
])
def test_spec_rules_name_the_field(changes: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        QWEN2_MOE.with_(**changes)


def test_spec_counts_and_record() -> None:
    """A layer with experts holds the routed experts, the router, the shared expert and its gate; a dense layer
    the dense MLP; the model's total sums each layer's own; a spec without the new fields dumps as before."""
    s = QWEN2_MOE
    h, f, fe, fs = 2048, 5632, 1408, 5632
    assert s.shared_expert_params() == 3 * h * fs + h
    assert s.mlp_params() == 60 * 3 * h * fe + h * 60 + 3 * h * fs + h
    assert s.mlp_params(False) == 3 * h * f
    assert s.active_mlp_params() == 4 * 3 * h * fe + h * 60 + 3 * h * fs + h
    assert [s.moe_layer(i) for i in range(4)] == [False, True, True, True] and s.moe_layers == 3
    assert s.block_params(0) == s.layer_params(False) and s.block_params(1) == s.layer_params()
    assert s.total_params() == (s.embedding_params() + sum(s.block_params(i) for i in range(4)) + s.head_params())
    assert s.with_(dense_layers=(2, 0)).dense_layers == (0, 2)  # kept in order
    dumped = QWEN3_MOE.model_dump()
    assert not {"shared_expert_ffn_hidden", "shared_expert_gate", "dense_layers"} & set(dumped)
    assert ModelSpec.model_validate_json(s.model_dump_json()) == s
    with pytest.raises(ValueError, match="moe: this model has no experts"):
        s.with_(**NO_EXPERTS).layer_params(True)


def _flops(ops: list) -> float:
    return sum(k.flops for op in ops for k in op.fwd)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_operators_of_the_shared_expert_and_the_dense_layer(t: int) -> None:
    """The shared expert's GEMMs are a dense MLP of its width split over ``t`` (``2 T 3 h f_s / t`` forward FLOPs);
    its gate a ``(T, 1, h)`` GEMV; a dense layer is the dense model's layer, operator for operator."""
    b, T, h = 1, 4096, 2048
    ops = layer_operators(QWEN2_MOE, b, t, FLASH)
    shared = [op for op in ops if op.name.startswith("shared_")]
    assert [op.name for op in shared] == ["shared_up_gate", "shared_act_mul", "shared_down", "shared_gate",
                                          "shared_gate_mul", "shared_add"]
    gemms = [op for op in shared if op.name in ("shared_up_gate", "shared_down")]
    assert _flops(gemms) == pytest.approx(2 * T * 3 * h * 5632 / t)
    assert _flops([op for op in shared if op.name == "shared_gate"]) == pytest.approx(2 * T * h)
    ungated = layer_operators(QWEN2_MOE.with_(shared_expert_gate=False), b, t, FLASH)
    assert [op.name for op in ungated if op.name.startswith("shared_")] == ["shared_up_gate", "shared_act_mul",
                                                                              "shared_down", "shared_add"]
    without = layer_operators(QWEN2_MOE.with_(shared_expert_ffn_hidden=None, shared_expert_gate=False), b, t, FLASH)
    assert [op.name for op in without] == [op.name for op in ops if not op.name.startswith("shared_")]
    dense_model = QWEN2_MOE.with_(**NO_EXPERTS)
    assert layer_operators(QWEN2_MOE, b, t, FLASH, moe=False) == layer_operators(dense_model, b, t, FLASH)


def test_analytic_profile_has_a_block_per_kind() -> None:
    """The dense first layer: the dense model's block (params, times, no experts); the others hold the routed
    experts in ``expert_params`` (not the shared expert, which expert parallelism does not split) and their times
    at every expert-parallel size; the profile's parameters are the spec's; the shape records the shared expert."""
    prof = analytic_profile(QWEN2_MOE, H100, options=FLASH, micro_batches=(1,), tensor_sizes=(1, 2))
    dense_model = QWEN2_MOE.with_(**NO_EXPERTS)
    plain = analytic_profile(dense_model, H100, options=FLASH, micro_batches=(1,), tensor_sizes=(1, 2))
    blocks = [lay for lay in prof.layers if lay.kind == "transformer"]
    assert blocks[0].params == QWEN2_MOE.layer_params(False) == plain.layers[1].params
    assert blocks[0].expert_params == 0 and blocks[0].expert_times is None
    assert blocks[0].tensor_times == plain.layers[1].tensor_times
    for lay in blocks[1:]:
        assert lay.params == QWEN2_MOE.layer_params() and lay.expert_params == 60 * QWEN2_MOE.expert_params()
        assert set(lay.expert_times or {}) == {2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60}
        assert lay.fwd_time[1] > blocks[0].fwd_time[1]
    assert sum(lay.params - lay.tied_params for lay in prof.layers) == QWEN2_MOE.total_params()
    assert prof.shape is not None and prof.shape.shared_expert_ffn_hidden == 5632
    assert "shared expert of width 5632 (gated)" in prof.notes and "1 of 4 layers dense" in prof.notes
    assert "shared_expert_ffn_hidden" not in analytic_profile(QWEN3_MOE.with_(layers=2), H100, options=FLASH,
                                                              micro_batches=(1,), tensor_sizes=(1,)).model_dump_json()


def _costs(profile, config: Config):  # type: ignore[no-untyped-def]
    gpus = config.tensor * config.pipeline * config.data
    planner = Planner(profile, h100_cluster(), TrainingRequest(global_batch=64, gpus=gpus))
    cand, costs = planner.prepare(config)
    assert costs is not None, cand.reason
    return costs


@pytest.mark.parametrize(("options", "expert", "etp"), [(FLASH, 1, None), (SP, 1, None), (SP, 2, None), (SP, 2, 1)])
def test_shared_expert_adds_a_dense_mlps_collectives(options: OperatorOptions, expert: int, etp: int | None) -> None:
    """Megatron-Core's SharedExpertMLP gathers its input and reduce-scatters its output (all-reduces it without
    sequence parallelism) on its own: per layer with experts one more of a dense layer's collectives in each pass,
    and with sequence parallelism one more re-gather in the backward, whatever the routed experts' split. Dense
    layers have none of it."""
    prof = analytic_profile(QWEN2_MOE, H100, options=options, micro_batches=(1,), tensor_sizes=(1, 2))
    assert prof.shape is not None
    bare = prof.model_copy(update={"shape": prof.shape.model_copy(update={"shared_expert_ffn_hidden": None})})
    cfg = Config(tensor=2, pipeline=2, data=2, micro_batch=1, schedule="1f1b", expert=expert, expert_tensor=etp)
    with_shared, without = _costs(prof, cfg), _costs(bare, cfg)
    one = with_shared._tp_one(1)
    assert one > 0
    assert sum(info.moe_layers for info in with_shared.stages) == 3  # (the dense layer 0 counts none)
    for stage, info in enumerate(with_shared.stages):
        moe = info.moe_layers
        assert with_shared._tp_comm(stage, 1) - without._tp_comm(stage, 1) == pytest.approx(moe * one)
        regather = with_shared._sp_regather(stage, 1) - without._sp_regather(stage, 1)
        if options.sequence_parallel:
            assert regather == pytest.approx(moe * with_shared._tp_all_gather(4096 * 2048 * 2))
        else:
            assert regather == 0.0
    at_one = _costs(prof, cfg.model_copy(update={"tensor": 1, "data": 4}))
    assert at_one._tp_comm(0, 1) == 0.0


def test_dense_layers_do_no_all_to_all() -> None:
    """Expert parallelism's all-to-alls run in the layers with experts only: at four stages of one transformer layer
    each, the stage of the dense layer does none, the others one dispatch and one combine each."""
    prof = analytic_profile(QWEN2_MOE.with_(vocab=512), H100, options=SP, micro_batches=(1,), tensor_sizes=(1, 2))
    costs = _costs(prof, Config(tensor=2, pipeline=4, data=2, micro_batch=1, schedule="1f1b", expert=2))
    assert [info.moe_layers for info in costs.stages] == [0, 1, 1, 1], [info.layers for info in costs.stages]
    assert costs.ep_comm(0, 1) == 0.0 and costs.ep_comm(1, 1) > 0
    assert costs.ep_comm(2, 1) == pytest.approx(costs.ep_comm(1, 1))


def test_plan_a_model_with_shared_experts() -> None:
    """The search plans it: rows with and without expert parallelism; the best row predicted from the shared
    expert's costs (its profile times exceed those of the same model without the shared expert)."""
    prof = analytic_profile(QWEN2_MOE, H100, options=SP, micro_batches=(1, 2))
    bare_spec = QWEN2_MOE.with_(shared_expert_ffn_hidden=None, shared_expert_gate=False)
    bare = analytic_profile(bare_spec, H100, options=SP, micro_batches=(1, 2))
    req = TrainingRequest(global_batch=64, gpus=8)
    res, res_bare = plan(prof, h100_cluster(), req), plan(bare, h100_cluster(), req)
    assert res.candidates and res_bare.candidates
    assert res.candidates[0].iteration_time > res_bare.candidates[0].iteration_time
    assert {c.config.expert for c in res.candidates} - {1}
