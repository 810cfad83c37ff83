"""Whole experts (expert tensor parallelism 1, planner.expert_parallel "Expert tensor parallelism"): the operator
model's times, the configuration's rules, the view's parameters, the costs (no collectives around the experts, the
all-to-all among a stage's ranks, the experts' reduction over their t W / e holders), memory, the search's bounds
and exactness, the executor's refusal and the Megatron export."""

from __future__ import annotations

from collections import Counter

import pytest
from moe_support import H100, QWEN3_MOE, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.cost import allreduce_time, alltoall_time
from planner.expert_parallel import ep_group, ep_slots, expert_data_ranks, expert_data_slots, expert_error
from planner.operators import OperatorOptions, layer_flops, layer_operators
from planner.request import Config, TrainingRequest
from planner.runspec import RunSpec, executor_refusal
from planner.search import Planner, predict

SP = OperatorOptions(attention="flash", causal=True, dropout=False, sequence_parallel=True)
#: Qwen3-30B-A3B's shape with 4 layers
QWEN = QWEN3_MOE.with_(name="qwen3-moe-4l", layers=4)


@pytest.fixture(scope="module")
def h100():
    return h100_cluster()


@pytest.fixture(scope="module")
def qwen():
    return analytic_profile(QWEN, H100, micro_batches=(1, 2), tensor_sizes=(1, 2, 4), options=SP)


def test_whole_experts_run_the_same_flops_on_the_ranks_own_tokens():
    """At t = 4, e = 8: each rank's 16 experts whole on the copies of its T/4 tokens' group (the split experts' FLOPs),
    and no expert GEMM is split over t."""
    split = layer_operators(QWEN, 1, 4, SP, expert=8)
    whole = layer_operators(QWEN, 1, 4, SP, expert=8, expert_tensor=1)
    assert layer_flops(whole)[0] == pytest.approx(layer_flops(split)[0], rel=0.02)
    up = next(op for op in whole if op.name == "experts_up")
    assert up.fwd[0].flops == pytest.approx(next(op for op in split if op.name == "experts_up").fwd[0].flops, rel=0.02)
    with pytest.raises(ValueError, match="sequence parallelism"):
        layer_operators(QWEN, 1, 4, OperatorOptions(attention="flash"), expert=8, expert_tensor=1)


def test_the_configurations_rules():
    ok = Config(tensor=4, pipeline=1, data=2, expert=8, expert_tensor=1, micro_batch=1, schedule="1f1b")
    assert ok.etp == 1 and ok.expert_data == 1 and ok.label().startswith("t=4 D=1 W=2 e=8 etp=1")
    assert ok.model_dump()["expert_tensor"] == 1 and "expert_tensor" not in ok.model_copy(
        update={"expert_tensor": None}).model_dump()
    for kw, match in ((dict(tensor=1, data=8, expert_tensor=1), "t > 1"),
                      (dict(tensor=4, data=2, expert=16, expert_tensor=1), "divide t W"),
                      (dict(tensor=2, data=4, expert=2, expert_tensor=2), r"1 \(the experts whole on each rank\)"),
                      (dict(tensor=4, pipeline=2, data=2, expert=8, expert_tensor=1), "order tp-dp-pp")):
        with pytest.raises(ValidationError, match=match):
            Config(**{"pipeline": 1, "micro_batch": 1, "schedule": "1f1b", **kw})
    Config(tensor=4, pipeline=2, data=2, expert=8, expert_tensor=1, order="tp-dp-pp", micro_batch=1, schedule="1f1b")
    Config(tensor=4, pipeline=2, data=2, expert=4, expert_tensor=1, micro_batch=1, schedule="1f1b")  # e etp = t


def test_slots_are_megatron_cores_expert_rank_order():
    """j = (q e + i) etp + r: with etp = t the replicas of ep_group / expert_data_ranks at each tensor rank; with
    etp = 1 consecutive ranks of the stage."""
    assert ep_slots(0, 4, 1) == [0, 1, 2, 3] and ep_slots(5, 4, 1) == [4, 5, 6, 7]
    assert expert_data_slots(1, 2, 1, 8) == [1, 3, 5, 7]
    t, W = 2, 8
    for e in (1, 2, 4, 8):
        for j in range(t * W):
            w, k = divmod(j, t)
            assert [divmod(x, t) for x in ep_slots(j, e, t)] == [(v, k) for v in ep_group(w, e)]
            assert [divmod(x, t) for x in expert_data_slots(j, e, t, t * W)] == [
                (v, k) for v in expert_data_ranks(w, e, W)]


def test_costs_with_whole_experts(h100, qwen):
    req = TrainingRequest(global_batch=16, gpus=8)
    base = dict(tensor=4, pipeline=1, data=2, micro_batch=1, schedule="1f1b")
    whole = predict(qwen, h100, req, Config(**base, expert=8, expert_tensor=1))
    split = predict(qwen, h100, req, Config(**base, expert=2))
    a, b = whole.costs, split.costs
    assert a is not None and b is not None and whole.iteration_time < split.iteration_time
    info = a.stages[0]
    L, moe = info.transformer_layers, info.moe_layers
    assert L == moe == 4
    one = a._tp_one(1)
    assert a._tp_comm(0, 1) == pytest.approx(L * one * a.cal.link_scale)  # attention's only
    assert b._tp_comm(0, 1) == pytest.approx((L * one + moe * b._tp_one(8)) * b.cal.link_scale)  # k = 8 copies
    # the all-to-all among the stage's 8 ranks (one node), T/t k h bytes each
    nbytes = 1 * 4096 * 8 * 2048 * 2 / 4
    assert a.ep_comm(0, 1) == pytest.approx(2 * moe * alltoall_time(h100, list(range(8)), nbytes) * a.cal.link_scale)
    # the view holds 1/8 of the experts whole: per rank t = 4 times the split share at e = 8
    lay = next(x for x in qwen.layers if x.expert_params)
    held = a.profile.layers[1]
    assert held.expert_params == lay.expert_params // 8 * 4
    # e = 8 over t W = 8 ranks: each expert on one rank, nothing to reduce; the dense part over the 2 replicas
    dense = (info.param_bytes - info.expert_param_bytes) / 4
    assert a.allreduce(0, 0, 0) == pytest.approx(allreduce_time(h100, [0, 4], dense) * a.cal.link_scale)
    # e = 2 with whole experts: each held by 4 ranks of the 8 (the same EP rank in every group)
    two = predict(qwen, h100, req, Config(**base, expert=2, expert_tensor=1)).costs
    assert two is not None
    experts = two.stages[0].expert_param_bytes / 4
    assert two.allreduce(0, 0, 0) == pytest.approx(
        (allreduce_time(h100, [0, 4], dense) + allreduce_time(h100, [0, 2, 4, 6], experts)) * two.cal.link_scale)
    assert "whole (etp=1)" in whole.to_dict()["compute"] and whole.to_dict()["expert_tensor"] == 1


def test_memory_holds_the_experts_whole(h100, qwen):
    req = TrainingRequest(global_batch=16, gpus=8)
    base = dict(tensor=4, pipeline=1, data=2, expert=8, micro_batch=1, schedule="1f1b")
    p = Planner(qwen, h100, req)
    whole_state = sum(p.prepare(Config(**base, expert_tensor=1))[0].state)
    lay = next(x for x in qwen.layers if x.expert_params)
    experts_per_rank = 4 * lay.expert_params // 8  # four layers, 1/8 of each one's experts, whole
    dense = predict(qwen, h100, req, Config(**{**base, "expert": 1, "data": 2})).costs
    assert dense is not None
    # 16 bytes per parameter: the experts' whole share, the rest over t = 4
    rest = (sum(x.params for x in qwen.layers) - 4 * lay.expert_params) / 4
    assert whole_state == pytest.approx(16 * (experts_per_rank + rest), rel=1e-6)


def test_the_search_plans_whole_experts_exactly(h100, qwen):
    """Whole experts among the rows (the 8-GPU recipe t = 4 e = 8 etp = 1 of Qwen3-30B-A3B's shape), bounds that
    hold and a pruned search that ranks as simulating everything."""
    req = TrainingRequest(global_batch=16, gpus=8, top=6, schedules=["1f1b", "interleaved"])
    p = Planner(qwen, h100, req)
    configs = p.configs(Counter())
    assert any(c.expert_tensor == 1 and c.expert == 8 and c.tensor == 4 for c in configs)
    assert all(c.tensor > 1 and (c.tensor * c.data) % c.expert == 0 for c in configs if c.expert_tensor)
    for cfg in configs:
        cand, costs = p.prepare(cfg)
        if costs is not None:
            p.refine(cand, costs)
            p.evaluate(cand, costs)
            if cand.iteration_time:
                assert cand.lower_bound <= cand.iteration_time * (1 + 1e-9), cfg.label()
    pruned = Planner(qwen, h100, req).search()
    full = Planner(qwen, h100, req).search(prune=False)
    assert [(c.config, c.iteration_time) for c in pruned.candidates] == \
        [(c.config, c.iteration_time) for c in full.candidates]
    assert any(c.config.expert_tensor == 1 for c in full.candidates)


def test_without_sequence_parallelism_or_experts_it_is_refused(h100):
    plain = analytic_profile(QWEN, H100, micro_batches=(1,), tensor_sizes=(1, 2),
                             options=OperatorOptions(attention="flash", causal=True, dropout=False))
    assert "sequence parallelism" in (expert_error(plain, 2, False, 1) or "")
    assert not any(c.expert_tensor for c in Planner(plain, h100, TrainingRequest(global_batch=8, gpus=8)).configs(
        Counter()))


def test_executor_refuses_and_megatron_exports_it():
    from planner.export.common import ExportError, ExportInput
    from planner.export.megatron import arguments, export, parse

    cfg = Config(tensor=4, pipeline=1, data=2, expert=8, expert_tensor=1, micro_batch=1, schedule="1f1b")
    assert "expert_tensor" in (executor_refusal(cfg) or "")
    spec = RunSpec(config=cfg, microbatches=8)
    inp = ExportInput(spec=spec, model=QWEN, expert_gemm="grouped", sequence_parallel=True, gpus_per_node=8)
    line = " ".join(arguments(inp))
    assert "--expert-model-parallel-size 8 --expert-tensor-parallel-size 1 --moe-token-dispatcher-type alltoall" in line
    back = parse(export(inp).files[0].content)
    assert back.config == cfg
    # the pipeline inside data parallelism: Megatron-Core allows whole experts there only with e etp = t (each EP group
    # a tensor group), and the export too
    for whole, ok in ((1, True), (None, False)):
        inner = Config(tensor=4, pipeline=2, data=2, expert=4 if whole else 2, expert_tensor=whole, micro_batch=1,
                       schedule="1f1b", order="tp-pp-dp")
        got = ExportInput(spec=RunSpec(config=inner, microbatches=8), model=QWEN, expert_gemm="grouped",
                          sequence_parallel=True, gpus_per_node=8)
        if ok:
            assert "--use-tp-pp-dp-mapping" in " ".join(arguments(got)) and parse(export(got).files[0].content).config \
                == inner
        else:
            with pytest.raises(ExportError, match="ranks=tp-dp-pp"):
                arguments(got)
    from planner.export import UnsupportedSchedule
    from planner.export import export as export_any
    from planner.export.megatron import check

    # the schedule Megatron runs in place of one it lacks keeps the row's experts (whole) and order
    chimera = cfg.model_copy(update={"schedule": "chimera", "pipelines": 1, "pipeline": 2, "data": 1, "expert": 4,
                                     "order": "tp-dp-pp"})
    with pytest.raises(UnsupportedSchedule) as refused:
        check(RunSpec(config=chimera, microbatches=8))
    stand_in = refused.value.closest.config
    assert (stand_in.expert, stand_in.expert_tensor, stand_in.order) == (4, 1, "tp-dp-pp")

    for fmt in ("torchtitan", "deepspeed"):
        with pytest.raises(ExportError, match="megatron export writes it"):
            export_any(fmt, inp)
