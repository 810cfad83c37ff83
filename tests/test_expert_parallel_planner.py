"""Expert parallelism in the planner (planner.expert_parallel): the profile an EP rank holds, the experts' times at e,
the all-to-alls, the split gradient reduction, the memory, the enumeration and an exact search."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from moe_support import FLASH, H100, MIXTRAL, QWEN3_MOE, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.cost import allreduce_time, alltoall_time, collective_time
from planner.enumeration import enumerate_configs
from planner.expert_parallel import EXPERT_TIMES_KEY, expert_data_ranks, expert_error, expert_sizes, expert_view
from planner.operators import OperatorOptions, layer_operators, time_operators
from planner.request import Config, TrainingRequest
from planner.search import Planner, predict


@pytest.fixture(scope="module")
def h100():
    return h100_cluster()


@pytest.fixture(scope="module")
def qwen():
    return analytic_profile(QWEN3_MOE, H100, micro_batches=(1, 2), tensor_sizes=(1, 2), options=FLASH)


@pytest.fixture(scope="module")
def mixtral():
    return analytic_profile(MIXTRAL, H100, micro_batches=(1, 2), tensor_sizes=(1, 2), options=FLASH)


def test_sizes_and_groups():
    assert expert_sizes(None, 16) == [1]
    assert expert_sizes(8, 12) == [1, 2, 4]
    assert expert_sizes(128, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert expert_data_ranks(5, 4, 16) == [1, 5, 9, 13]


def test_the_view_holds_one_eth_of_the_experts(qwen):
    """An EP rank's profile: each block with 1/e of its experts' parameters and its times at e; the rest as it is."""
    view = expert_view(qwen, 8)
    assert EXPERT_TIMES_KEY not in view.environment
    block, whole = view.layers[1], qwen.layers[1]
    experts = 128 * QWEN3_MOE.expert_params()
    assert whole.expert_params == experts
    assert block.expert_params == experts // 8 and block.params == whole.params - experts + experts // 8
    assert block.param_bytes == 2 * block.params
    assert block.tensor_times == whole.expert_times[8] and block.fwd_time == whole.expert_times[8][1].fwd_time
    assert view.layers[0] is qwen.layers[0] and view.layers[-1] is qwen.layers[-1]
    assert expert_view(qwen, 1) is qwen
    # a profile without times at e (a measured one): the times without expert parallelism, said in the environment
    bare = qwen.model_copy(update={"layers": [lay.model_copy(update={"expert_times": None}) for lay in qwen.layers]})
    view = expert_view(bare, 8)
    assert view.environment[EXPERT_TIMES_KEY] == "e=1"
    assert view.layers[1].fwd_time == qwen.layers[1].fwd_time and view.layers[1].expert_params == experts // 8


def test_experts_at_e_run_the_same_flops_in_larger_gemms():
    """Balanced routing: at e the rank's E/e experts see e T k / E rows each, the same GEMM FLOPs as all E on
    T k / E; one expert at a time that is E/e launches instead of E, so 128 small experts run faster."""
    seq = OperatorOptions(attention="flash", causal=True, dropout=False, expert_gemm="sequential")
    flops = {e: sum(k.flops for op in layer_operators(QWEN3_MOE, 1, 1, FLASH, expert=e) for k in op.fwd
                    if k.gemm is not None) for e in (1, 8)}
    assert flops[8] == pytest.approx(flops[1], rel=1e-9)
    one = {e: time_operators(layer_operators(QWEN3_MOE, 1, 1, seq, expert=e), H100, "bf16").fwd for e in (1, 8)}
    assert one[8] < 0.8 * one[1]
    grouped = {e: time_operators(layer_operators(QWEN3_MOE, 1, 1, FLASH, expert=e), H100, "bf16").fwd
               for e in (1, 8)}
    assert grouped[8] <= grouped[1] * 1.001  # larger GEMMs: no slower


def test_alltoall_time(h100):
    """Within a node the all-to-all moves (r-1)/r of the bytes on NVLink; across nodes (r-c)/r of them leave on the
    rank's NIC at once, which sets the time."""
    L = 64e6
    inside = alltoall_time(h100, [0, 1, 2, 3], L)
    assert inside == pytest.approx(collective_time(h100, "intra", "p2p", 2, L * 3 / 4))
    across = alltoall_time(h100, [0, 4, 8, 12], L)  # two per node
    assert across == pytest.approx(collective_time(h100, "inter", "p2p", 2, L / 2))
    assert across > 3 * inside
    assert alltoall_time(h100, [0], L) == 0.0 and alltoall_time(h100, [0, 1], 0.0) == 0.0


def test_costs_charge_the_alltoalls_and_split_the_reduction(h100, mixtral):
    """F and B gain the dispatch and combine of every MoE layer (a recomputed B its forward's again); the dense
    weights are all-reduced over all W copies and the experts' over the W/e holding them."""
    req = TrainingRequest(global_batch=64, gpus=32)
    base = dict(tensor=1, pipeline=2, data=16, micro_batch=1, schedule="1f1b")
    one = predict(mixtral, h100, req, Config(**base)).costs
    four = predict(mixtral, h100, req, Config(**base, expert=4)).costs
    four_rc = predict(mixtral, h100, req, Config(**base, expert=4, recompute=True)).costs
    assert one is not None and four is not None and four_rc is not None
    layers = four.stages[0].moe_layers
    assert layers == 2 and four.ep_comm(0, 1) > 0 and one.ep_comm(0, 1) == 0
    # EP groups of replicas 0-3 at pipeline device 0: GPUs 0, 2, 4, 6 (D t = 2 apart): one node
    nbytes = 1 * 4096 * 2 * 4096 * 2  # T k h el
    a2a = alltoall_time(h100, [0, 2, 4, 6], nbytes)
    counts = alltoall_time(h100, [0, 2, 4, 6], 8 * 8)  # E int64 per rank
    assert 0 < counts < a2a / 10
    assert four.ep_comm(0, 1) == pytest.approx(2 * layers * a2a)
    assert four.fwd(0) == pytest.approx(four._plain_fwd(0, 1) + 2 * layers * a2a + layers * counts)
    assert four.bwd(0) == pytest.approx(four._plain_bwd(0) + 2 * layers * a2a)
    assert four_rc.bwd(0) == pytest.approx(four_rc._plain_bwd(0) + 4 * layers * a2a + layers * counts)
    info = four.stages[0]
    dense = (info.param_bytes - info.expert_param_bytes)
    dp = [four.rank(0, w) for w in range(16)]
    edp = [four.rank(0, w) for w in expert_data_ranks(0, 4, 16)]
    assert four.allreduce(0, 0, 0) == pytest.approx(allreduce_time(h100, dp, dense)
                                                    + allreduce_time(h100, edp, info.expert_param_bytes))
    assert four.allreduce(0, 0, 0) < one.allreduce(0, 0, 0)


def test_memory_holds_one_eth_of_the_experts(h100, mixtral):
    """Model state: the dense weights' 16 bytes per parameter, the experts' on 1/e of them; with a sharded optimizer
    the experts' optimizer state is split over their W/e replicas."""
    base = dict(tensor=1, pipeline=2, data=16, micro_batch=1, schedule="1f1b")
    for shard in (False, True):
        req = TrainingRequest(global_batch=64, gpus=32, shard_optimizer=shard)
        for e in (1, 4):
            cand, costs = Planner(mixtral, h100, req).prepare(Config(**base, expert=e))
            assert costs is not None, cand.reason
            info = costs.stages[0]
            dense, experts = info.params - info.expert_params, info.expert_params
            assert experts == pytest.approx(mixtral.layers[1].expert_params * 2 / e)
            want = dense * req.state_bytes_per_param(16) + experts * req.state_bytes_per_param(16 // e)
            assert cand.state[0] == pytest.approx(want)


def test_enumeration_and_refusals(h100, mixtral):
    req = TrainingRequest(global_batch=64, gpus=16, schedules=["1f1b"], allow_recompute=False, micro_batches=[1])
    got = {(c.pipeline, c.data, c.expert) for c in enumerate_configs(6, h100, req, Counter(), 32, experts=8)
           if c.tensor == 1}
    assert {(1, 16, e) for e in (1, 2, 4, 8)} <= got and (2, 8, 8) in got and (4, 4, 8) not in got
    assert {c.expert for c in enumerate_configs(6, h100, req, Counter(), 32)} == {1}
    capped = req.model_copy(update={"max_expert": 2})
    assert {c.expert for c in enumerate_configs(6, h100, capped, Counter(), 32, experts=8)} == {1, 2}
    rejected: Counter[str] = Counter()
    fsdp = req.model_copy(update={"shard_parameters": True})
    assert {c.expert for c in enumerate_configs(6, h100, fsdp, rejected, 32, experts=8)} == {1}
    assert any("sharded weights" in k for k in rejected)
    dense = analytic_profile(MIXTRAL.with_(experts=None, experts_per_token=None), H100, micro_batches=(1,),
                             tensor_sizes=(1,), options=FLASH)
    assert "needs a mixture of experts" in expert_error(dense, 2)
    assert "must divide the model's 8 experts" in expert_error(mixtral, 3)
    assert "shard_parameters" in expert_error(mixtral, 2, shard_parameters=True)
    cand, costs = Planner(dense, h100, req).prepare(Config(tensor=1, pipeline=1, data=16, expert=2, micro_batch=1,
                                                           schedule="1f1b"))
    assert costs is None and cand.reason.startswith("expert: expert parallelism (2) needs a mixture of experts")
    with pytest.raises(ValidationError, match="expert-parallel size 4 must divide data"):
        Config(tensor=1, pipeline=1, data=6, expert=4, micro_batch=1, schedule="1f1b")


def test_label_and_record():
    c = Config(tensor=2, pipeline=4, data=8, expert=4, micro_batch=1, schedule="1f1b")
    assert c.label() == "t=2 D=4 W=8 e=4 b=1 1f1b"
    assert Config.model_validate(c.model_dump()) == c
    assert "expert" not in c.model_copy(update={"expert": 1}).model_dump()


@pytest.mark.slow
def test_pruned_search_with_experts_is_exact(h100, qwen):
    """The bounds hold with the all-to-alls and the split reduction: the pruned search ranks as simulating every
    configuration does, and expert-parallel rows are among those ranked."""
    req = TrainingRequest(global_batch=32, gpus=16, top=6, schedules=["1f1b", "gpipe", "interleaved", "zb-h1"])
    pruned = Planner(qwen, h100, req).search()
    full = Planner(qwen, h100, req).search(prune=False)
    assert [c.config for c in pruned.candidates] == [c.config for c in full.candidates]
    assert [c.iteration_time for c in pruned.candidates] == [c.iteration_time for c in full.candidates]
    assert any(c.config.expert > 1 for c in full.candidates)
    for c in full.candidates:
        assert c.lower_bound <= c.iteration_time * (1 + 1e-9)


@pytest.mark.slow
def test_work_bound_holds_for_every_schedule_with_experts(h100, qwen):
    """The bound the search orders candidates by until it reaches them (planner.bounds.TimeBounds.work_bound: the
    layers' compute and all-to-alls over D devices) is at most every simulated time -- every schedule, Chimera's
    doubled forwards, e > 1 -- and above half of it for most (a bound near 0 would hold and prune nothing); the
    pruned search that uses it ranks as simulating everything does."""
    from search_support import simulated_with_bounds

    req = TrainingRequest(global_batch=32, gpus=16, top=6)
    planner = Planner(qwen, h100, req)
    seen, tight = Counter(), 0
    for cfg, cand, costs, _ in simulated_with_bounds(planner):
        work = planner.bounds.work_bound(costs)
        assert 0 < work <= cand.iteration_time * (1 + 1e-9), cfg.label()
        seen[(cfg.schedule, cfg.concat, cfg.expert > 1)] += 1
        tight += work > 0.5 * cand.iteration_time
    assert {s for s, _, _ in seen} >= {"1f1b", "gpipe", "interleaved", "zb-h1", "chimera", "hanayo"}
    assert any(c == "forward-doubling" for _, c, _ in seen) and any(e for _, _, e in seen)
    assert tight > sum(seen.values()) / 2  # (a bound near 0 would hold too, and prune nothing)
    pruned = Planner(qwen, h100, req).search()
    full = Planner(qwen, h100, req).search(prune=False)
    assert [(c.config, c.iteration_time) for c in pruned.candidates] == \
        [(c.config, c.iteration_time) for c in full.candidates]


def test_megatron_export_splits_the_experts():
    """Megatron-LM gets the plan's e (and the all-to-all dispatcher) in its default rank order (the pipeline
    outermost, tp-dp-pp); with the pipeline inside data parallelism (--use-tp-pp-dp-mapping) Megatron-Core refuses
    expert parallelism at D > 1, and so does the export, naming the other order."""
    from planner.export.common import ExportError, ExportInput
    from planner.export.megatron import arguments
    from planner.runspec import RunSpec

    def line(D: int, order: str) -> str:
        spec = RunSpec(config=Config(tensor=2, pipeline=D, data=8, expert=4, micro_batch=1, schedule="1f1b",
                                     order=order), microbatches=16)
        return " ".join(arguments(ExportInput(spec=spec, model=MIXTRAL, expert_gemm="grouped", sequence_parallel=True)))

    for D, order in ((4, "tp-dp-pp"), (1, "tp-pp-dp"), (1, "tp-dp-pp")):
        got = line(D, order)
        assert "--expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall" in got
        assert "--use-tp-pp-dp-mapping" not in got
    with pytest.raises(ExportError, match="ranks=tp-dp-pp"):
        line(4, "tp-pp-dp")


def test_a_measured_profile_knows_its_experts():
    """``pipeplan profile --hf-config`` of a mixture of experts: each decoder layer's expert_params and the shape's
    experts, so the search splits their state at e > 1 (with the measured times: the same FLOPs)."""
    import json

    from profiler.hf_config import read_hf_config
    from profiler.hf_model import hf_layer_model
    from profiler.layer_model import profile_layer_model

    path = Path(__file__).resolve().parent / "fixtures" / "tiny-mixtral" / "config.json"
    spec = read_hf_config(path)
    lm, _ = hf_layer_model(json.loads(path.read_text()), spec.name, seq=16)
    prof = profile_layer_model(lm, [1], repeats=1, warmup=0)
    blocks = [lay for lay in prof.layers if lay.kind == "transformer"]
    assert blocks and all(lay.expert_params == int(spec.experts) * spec.expert_params() for lay in blocks)
    assert all(lay.expert_params < lay.params for lay in blocks)
    assert not any(lay.expert_params for lay in prof.layers if lay.kind != "transformer")
    assert (prof.shape.experts, prof.shape.experts_per_token) == (spec.experts, spec.experts_per_token)
    view = expert_view(prof, 2)
    assert view.environment[EXPERT_TIMES_KEY] == "e=1" and view.layers[1].fwd_time == prof.layers[1].fwd_time


def test_breakdown_and_split_backward_place_the_alltoalls(h100, mixtral):
    """The breakdown names the all-to-alls' part of the compute; a zero-bubble I carries the backward's all-to-alls
    (they move input gradients), W none."""
    req = TrainingRequest(global_batch=64, gpus=32)
    cand = predict(mixtral, h100, req, Config(tensor=1, pipeline=2, data=16, expert=4, micro_batch=1,
                                              schedule="zb-h1"))
    costs = cand.costs
    assert costs is not None and cand.breakdown["alltoall_in_compute"] > 0
    N = cand.microbatches
    assert cand.breakdown["alltoall_in_compute"] == pytest.approx(N * (costs.ep_in("F", 1) + costs.ep_in("B", 1)))
    assert costs.ep_in("W", 1) == 0 and costs.ep_in("I", 1) == costs.ep_in("B", 1)
    assert costs.work("I", 1, 1) + costs.work("W", 1, 1) == pytest.approx(costs.bwd(1))
    assert costs.work("I", 1, 1) > costs.ep_in("B", 1)
    dense = predict(mixtral, h100, req, Config(tensor=1, pipeline=2, data=16, micro_batch=1, schedule="zb-h1"))
    assert "alltoall_in_compute" not in dense.breakdown


def test_rows_at_different_e_are_not_twins(h100, mixtral):
    """Two configurations that differ only in e run the same lists but not the same thing (all-to-alls, memory):
    the plan keeps both rows, and the candidate document says e flat beside t, D and W."""
    from planner.equivalence import collapse

    req = TrainingRequest(global_batch=64, gpus=32)
    base = dict(tensor=1, pipeline=2, data=16, micro_batch=1, schedule="1f1b")
    one, two = (predict(mixtral, h100, req, Config(**base, expert=e)) for e in (1, 2))
    rows = collapse([one, two])
    assert [r.config.expert for r in rows] == [1, 2] and not rows[0].alternatives and not rows[1].alternatives
    assert two.to_dict()["expert"] == 2 and "expert" not in one.to_dict()


def test_sequence_parallel_experts_gather_their_token_copies(h100):
    """With sequence parallelism and e > 1 (Megatron-Core's all-to-all dispatcher) a layer with experts all-gathers
    and reduce-scatters its T k token copies over the tensor-parallel group where a dense MLP moves T h, and keeps
    them for the weight gradients (one re-gather per layer, the QKV input's); at e = 1 (the default dispatcher)
    and without sequence parallelism the dense layer's collectives."""
    options = OperatorOptions(attention="flash", causal=True, dropout=False, sequence_parallel=True)
    sp = analytic_profile(MIXTRAL, H100, micro_batches=(1,), tensor_sizes=(1, 2), options=options)
    req = TrainingRequest(global_batch=16, gpus=16)
    base = dict(tensor=2, pipeline=1, data=8, micro_batch=1, schedule="1f1b")
    ep = predict(sp, h100, req, Config(**base, expert=2)).costs
    one = predict(sp, h100, req, Config(**base)).costs
    assert ep is not None and one is not None and ep.sequence_parallel
    info = ep.stages[0]
    L, moe, k = info.transformer_layers, info.moe_layers, 2
    assert L == moe == 4
    dense = ep._tp_one(1)
    copies = ep._tp_one(k)  # T k h: the copies of k samples' worth of tokens
    assert copies > 1.5 * dense
    assert ep._tp_comm(0, 1) == pytest.approx((L * dense + moe * copies) * ep.cal.link_scale)
    assert one._tp_comm(0, 1) == pytest.approx(2 * L * dense * one.cal.link_scale)
    gather = ep._tp_all_gather(1 * 4096 * 4096 * 2)
    assert ep._sp_regather(0, 1) == pytest.approx((2 * L - moe + 1) * gather * ep.cal.link_scale)
    assert one._sp_regather(0, 1) == pytest.approx((2 * L + 1) * gather * one.cal.link_scale)
