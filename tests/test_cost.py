"""Cost model terms against the papers' formulas."""

from __future__ import annotations

import math

import pytest

from planner.analytic import transformer_profile
from planner.cluster import Cluster, Link
from planner.cost import ConfigCosts, allreduce_time, rabenseifner, ring_allreduce
from planner.model import PRESETS
from planner.operators import head_operators, layer_operators
from planner.request import Config, TrainingRequest
from planner.schedules import build

G = 2**30


def cluster(gpn: int = 8, nodes: int = 4) -> Cluster:
    return Cluster(name="c", nodes=nodes, gpus_per_node=gpn, device="X", memory_bytes=80 * G,
                   peak_flops=100e12, intra=Link(alpha=1e-6, beta=1e-11), inter=Link(alpha=1e-5, beta=1e-10))


def test_rabenseifner_formula():
    link = Link(alpha=2.0, beta=3.0)
    assert rabenseifner(8, 100, link) == pytest.approx(2 * 3 * 2.0 + 2 * 7 / 8 * 3.0 * 100)
    assert rabenseifner(1, 100, link) == 0
    assert ring_allreduce(4, 100, link) == pytest.approx(2 * 3 * 2.0 + 2 * 3 / 4 * 3.0 * 100)


def test_allreduce_intra_vs_hierarchical():
    cl = cluster()
    one_node = allreduce_time(cl, [0, 1, 2, 3], 1e9)
    assert one_node == pytest.approx(rabenseifner(4, 1e9, cl.intra))
    spread = allreduce_time(cl, [0, 8, 16, 24], 1e9)  # one GPU on each of 4 nodes
    assert spread == pytest.approx(rabenseifner(4, 1e9, cl.inter))
    two_per_node = allreduce_time(cl, [0, 1, 8, 9], 1e9)
    inside = 2 * (1 * cl.intra.alpha + 0.5 * cl.intra.beta * 1e9)
    assert two_per_node == pytest.approx(inside + rabenseifner(2, 0.5e9, cl.inter))


def test_megatron_flops_match_formula():
    """With recomputation, the four passes over all layers give 96 B s l h^2 (1 + s/6h + V/16lh)."""
    spec = PRESETS["gpt3-175b"]
    L, h, s, V = spec.layers, spec.hidden, spec.seq, spec.vocab
    def gemm_flops(ops, passes):
        return sum(k.flops for op in ops for p in passes for k in getattr(op, p) if k.gemm is not None)

    layer, head = layer_operators(spec, 1), head_operators(spec, 1)
    f, b = gemm_flops(layer, ["fwd"]), gemm_flops(layer, ["bwd_i", "bwd_w"])
    hf, hb = gemm_flops(head, ["fwd"]), gemm_flops(head, ["bwd_i", "bwd_w"])
    flops = L * (2 * f + b) + hf + hb
    expect = 96 * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    assert flops == pytest.approx(expect, rel=1e-6)
    prof = transformer_profile("g", L, h, spec.heads, s, V, 1e15, "X", micro_batches=(1,))
    assert prof.total_params == pytest.approx(175e9, rel=0.01)


def make_costs(t: int, D: int = 4, gpn: int = 8, schedule: str = "1f1b", per_t: bool = False,
               **kw) -> ConfigCosts:
    """gpt2-medium; ``per_t=False`` strips the profile's per-t times (the scaled t = 1 path)."""
    spec = PRESETS["gpt2-medium"]
    prof = transformer_profile("m", spec.layers, spec.hidden, spec.heads, spec.seq, spec.vocab, 100e12, "X")
    if not per_t:
        prof = prof.model_copy(update={"layers": [x.model_copy(update={"tensor_times": None})
                                                  for x in prof.layers]})
    cfg = Config(tensor=t, pipeline=D, data=1, micro_batch=2, schedule=schedule, **kw)
    sched = build(schedule, D, 8)
    n = len(prof.layers)
    bounds = [(k * n // D, (k + 1) * n // D) for k in range(D)]
    return ConfigCosts(prof, cluster(gpn), TrainingRequest(global_batch=16), cfg, sched, bounds)


def test_tensor_parallel_comm_volume():
    """Megatron 3.2: 8 b s h (t-1)/t elements per layer and micro-batch, forward + backward."""
    c1, c4 = make_costs(1), make_costs(4)
    shape = c4.profile.shape
    layers = c4.stages[1].transformer_layers
    per_ar = ring_allreduce(4, 2 * shape.seq * shape.hidden * 2, c4.cluster.intra)  # b=2 samples, bf16
    expect_comm = 4 * layers * per_ar
    compute1 = c1.fwd(1) + c1.bwd(1)
    got_comm = c4.fwd(1) + c4.bwd(1) - compute1 / (4 * 0.95)
    assert got_comm == pytest.approx(expect_comm, rel=1e-9)
    volume = 4 * 2 * 3 / 4 * (2 * shape.seq * shape.hidden)  # 4 all-reduces, 2(t-1)/t elements each
    assert volume == pytest.approx(8 * 2 * shape.seq * shape.hidden * 3 / 4)


def test_p2p_link_by_placement():
    c = make_costs(t=4, D=4, gpn=8)  # devices 0,1 on node 0 (ranks 0, 4), 2,3 on node 1 (8, 12)
    # each of the t ranks sends the whole boundary tensor (no sequence parallelism, no scatter/gather)
    nbytes = c.stages[0].out_bytes * 2
    assert c.p2p("SEND_F", 0, 1, 0, 1) == pytest.approx(c.cluster.intra.time(nbytes))
    nbytes1 = c.stages[1].out_bytes * 2
    assert c.p2p("SEND_F", 1, 1, 1, 2) == pytest.approx(c.cluster.inter.time(nbytes1))


def test_recompute_backward_costs_a_forward_more():
    plain = make_costs(1)
    rc = make_costs(1, recompute=True)
    assert rc.bwd(1) == pytest.approx(plain.bwd(1) + plain.fwd(1))
    # recomputation keeps each transformer layer's input (2 s h per sample at 16 bits), not its whole stash
    info = rc.stages[1]
    assert rc.activation(1) == pytest.approx(info.transformer_layers * 2 * 1024 * 1024 * rc.base_b)  # s = h = 1024
    assert rc.activation(1) < plain.activation(1) / 10


def test_zero_bubble_split_sums_to_backward():
    c = make_costs(1)
    assert c.compute("I", 1, 1, 1) + c.compute("W", 1, 1, 1) == pytest.approx(c.bwd(1))
    assert math.isclose(c.compute("I", 1, 1, 1), c.compute("W", 1, 1, 1))


def test_tensor_parallel_allreduces_use_a_measured_fit_on_a_cpu_cluster():
    """On a cluster with a measured all-reduce (planner.cluster.AllReduceFit: the local CPU cluster) every
    tensor-parallel all-reduce at t > 1 is timed by that fit -- the layers' b s h all-reduces (_tp_one) and the
    embedding's, the head's and the cross-entropy's three b s fp32 ones (_tp_edges) alike -- not by the
    algorithm's cost from the p2p link."""
    from pathlib import Path

    from planner.cluster import AllReduceFit, load_cluster
    from planner.cost import collective_time

    root = Path(__file__).resolve().parent.parent
    base = load_cluster(root / "examples" / "clusters" / "local-cpu-4.json")
    fit = Link(alpha=2e-3, beta=5e-9)
    cl = base.model_copy(update={"allreduce_fit": AllReduceFit(ranks=4, link=fit)})
    prof = transformer_profile("tiny", 4, 256, 4, 128, 1024, 50e9, "cpu")
    n, b = len(prof.layers), 2
    costs = ConfigCosts(prof, cl, TrainingRequest(global_batch=8),
                        Config(tensor=2, pipeline=2, data=1, micro_batch=b, schedule="1f1b"),
                        build("1f1b", 2, 4), [(0, n // 2), (n // 2, n)])
    assert not costs.sequence_parallel and costs.stages[0].has_embedding and costs.stages[1].has_head
    s, h, scale = prof.shape.seq, prof.shape.hidden, costs.cal.link_scale
    bsh, loss = b * s * h * costs.el, b * s * 4.0
    assert costs._tp_one(b) == pytest.approx(fit.time(bsh))
    assert costs._tp_edges(0, b, backward=False) == pytest.approx(fit.time(bsh) * scale)  # embedding
    assert costs._tp_edges(1, b, backward=True) == pytest.approx(fit.time(bsh) * scale)  # head's input gradient
    assert costs._tp_edges(1, b, backward=False) == pytest.approx(3 * fit.time(loss) * scale)  # cross-entropy
    assert fit.time(loss) != pytest.approx(collective_time(cl, "intra", "all_reduce", 2, loss))  # can fail


def test_zero_bubble_w_of_a_checkpointed_stage_is_a_whole_backward():
    """With full recomputation the executor does not split a stage with checkpointed layers
    (executor.split_backward): its W is one backward for the weights -- recomputed forward, input and weight
    gradients -- while I stays the recomputation and the input gradient. Both profile paths."""
    for per_t in (False, True):
        c = make_costs(1, schedule="zb-h1", recompute=True, per_t=per_t)
        assert c.stages[1].transformer_layers > 0
        assert c.work("W", 1, 1) == pytest.approx(c._plain_bwd(1))
        assert c.work("I", 1, 1) > c.recompute_extra(1) > 0
        plain = make_costs(1, schedule="zb-h1", per_t=per_t)
        assert plain.work("I", 1, 1) + plain.work("W", 1, 1) == pytest.approx(plain.bwd(1))


def test_split_backward_overhead_per_layer_of_a_split_stage():
    """The executor's measured split-backward overhead (ExecutorOverhead.split_input / split_weight) is charged
    per layer of the stage to its I and W, not to F or B, and not where the stage is not split."""
    from planner.cluster import ExecutorOverhead

    ex = ExecutorOverhead(compute=1e-4, split_input=2e-4, split_weight=3e-4)
    c = make_costs(1, schedule="zb-h1")
    c.cluster = c.cluster.model_copy(update={"executor": ex})
    from planner.cost import ActionOverheads

    ov = ActionOverheads(c.cluster, c.emulated)
    i, j = c.stages[1].layers
    dev = c.schedule.placement[0][1]
    f = ov.of(c, "F", 1, dev)
    assert ov.of(c, "I", 1, dev) - ov.of(c, "B", 1, dev) == pytest.approx(2e-4 * (j - i))
    assert ov.of(c, "W", 1, dev) == pytest.approx(1e-4 + 3e-4 * (j - i))
    assert f < ov.of(c, "I", 1, dev)
    rc = make_costs(1, schedule="zb-h1", recompute=True)
    rc.cluster = rc.cluster.model_copy(update={"executor": ex})
    assert ActionOverheads(rc.cluster, rc.emulated).of(rc, "W", 1, dev) == pytest.approx(1e-4)


def test_held_output_gradients_of_a_split_backward():
    """The operator model's output gradients of the weight GEMMs (what a split backward's I keeps for its W):
    a GPT block keeps QKV (3h/t), the projection (h), MLP up (4h/t) and down (h) per token; the LM head its
    logits (V/t). Charged per micro-batch to zero-bubble stages only, and not where the executor does not
    split (full recomputation)."""
    from planner.analytic import analytic_profile
    from planner.device import get_device

    spec = PRESETS["gpt2-medium"]
    prof = analytic_profile(spec, get_device("A100-SXM4-80GB"), dtype="fp16", micro_batches=(1, 2),
                            tensor_sizes=(1, 4))
    s, h = spec.seq, spec.hidden
    block, head = prof.layers[1], prof.layers[-1]
    assert block.held_grad_bytes_per_sample == 2 * s * 9 * h
    assert block.tensor_times is not None
    assert block.tensor_times[4].held_grad_bytes_per_sample == 2 * s * (3 + 4) * h / 4 + 2 * 2 * s * h
    assert head.held_grad_bytes_per_sample == 2 * s * spec.vocab
    assert prof.layers[0].held_grad_bytes_per_sample == 2 * s * h  # the embedding's output gradient
    D = 4
    n = len(prof.layers)
    bounds = [(k * n // D, (k + 1) * n // D) for k in range(D)]
    cl = cluster()

    def costs(schedule: str, recompute: bool = False) -> ConfigCosts:
        cfg = Config(tensor=4, pipeline=D, data=1, micro_batch=2, schedule=schedule, recompute=recompute)
        return ConfigCosts(prof, cl, TrainingRequest(global_batch=16), cfg, build(schedule, D, 8), bounds)

    zb = costs("zb-h1")
    i, j = zb.stages[1].layers
    assert zb.held_grads(1) == pytest.approx(2 * (j - i) * (2 * s * 7 * h / 4 + 2 * 2 * s * h))
    assert costs("1f1b").held_grads(1) == 0.0
    assert costs("zb-h1", recompute=True).held_grads(1) == 0.0
