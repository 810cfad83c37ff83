"""The operator-level layer model, the device descriptions and the per-t compute in profiles and costs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from planner.analytic import analytic_profile
from planner.cluster import Cluster, Link
from planner.cost import ConfigCosts, collective_time, ring_allreduce
from planner.device import Curve, GemmPoint, device_for_cluster, get_device, shipped_devices
from planner.model import PRESETS, ModelSpec
from planner.operators import OperatorOptions, layer_operators, time_operators
from planner.profile import LayerProfile, ShardTimes
from planner.request import Config, TrainingRequest
from planner.schedules import build

GPT = PRESETS["gpt3-175b"]
A100 = get_device("A100-SXM4-80GB")


def saved(spec: ModelSpec, b: int = 1, t: int = 1, **kw) -> float:
    return sum(op.saved_bytes for op in layer_operators(spec, b, t, OperatorOptions(**kw)))


def gemm_flops(ops) -> float:
    return sum(k.flops for op in ops for k in op.fwd + op.bwd_i + op.bwd_w if k.gemm is not None)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_stash_is_korthikanti_for_gpt_shapes(t):
    """Korthikanti et al. 2022: s b h (34 + 5as/h) at t = 1 (eq. 1), s b h (10 + 24/t + 5as/(ht)) with tensor
    parallelism (eq. 2), s b h (34 + 5as/h)/t with sequence parallelism too (eq. 4); bytes at 16 bits."""
    s, h, a = GPT.seq, GPT.hidden, GPT.heads
    assert saved(GPT, 2, t) == pytest.approx(2 * s * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert saved(GPT, 2, t, sequence_parallel=True) == pytest.approx(2 * s * h * (34 + 5 * a * s / h) / t)
    # selective recomputation drops the 5as/h term (their section 5, Table 2): s b h (10 + 24/t), 34 s b h / t
    assert saved(GPT, 2, t, recompute="selective") == pytest.approx(2 * s * h * (10 + 24 / t))
    assert saved(GPT, 2, t, recompute="selective", sequence_parallel=True) == pytest.approx(2 * s * h * 34 / t)


def test_selective_reruns_the_attention_core_in_the_input_gradient():
    """Selective recomputation re-runs the four attention-core kernels' forward in the backward's I part
    (never W); the forward, W and the other operators are unchanged; full recomputation of such a layer
    re-runs the whole forward once (the core not a second time)."""
    plain = time_operators(layer_operators(GPT, 1, 8), A100, "fp16")
    sel = time_operators(layer_operators(GPT, 1, 8, OperatorOptions(recompute="selective")), A100, "fp16")
    core = ("scores", "softmax", "attn_dropout", "attn_v")
    rerun = sum(plain.per_op[n][0] for n in core)
    assert rerun > 0 and sel.rerun == pytest.approx(rerun)
    assert sel.fwd == pytest.approx(plain.fwd)
    assert sel.bwd_w == pytest.approx(plain.bwd_w)
    assert sel.bwd_i == pytest.approx(plain.bwd_i + rerun)
    for name, (f, i, w) in sel.per_op.items():
        assert (f, i - (f if name in core else 0.0), w) == pytest.approx(plain.per_op[name]), name
    assert sel.recompute == pytest.approx(plain.recompute)  # full: forward once + plain backward
    assert plain.rerun == 0.0


def test_selective_profile_records_it_and_pays_the_core_once():
    """In the analytic profile: the environment says so, the transformer layers' backward (and its I part)
    carries the core's re-run, their full-recomputation time is the plain profile's (forward once + plain
    backward), and the stash drops the 5 a s^2 term; the embedding and head are untouched."""
    spec = PRESETS["gpt2-medium"]
    plain = analytic_profile(spec, A100, micro_batches=(1, 2), tensor_sizes=(1, 2))
    sel = analytic_profile(spec, A100, micro_batches=(1, 2), tensor_sizes=(1, 2),
                           options=OperatorOptions(recompute="selective"))
    assert "recompute_granularity" not in plain.environment
    assert sel.environment["recompute_granularity"] == "selective"
    for lp, ls in zip(plain.layers, sel.layers, strict=True):
        for t in (1, 2):
            p, q = lp.tensor_times[t], ls.tensor_times[t]
            assert q.recompute_time == pytest.approx(p.recompute_time), (lp.name, t)
            assert q.bwd_weight_time == pytest.approx(p.bwd_weight_time)
            if lp.kind == "transformer":
                assert all(q.bwd_time[b] > p.bwd_time[b] for b in (1, 2))
                assert q.stashed_bytes_per_sample == pytest.approx(
                    p.stashed_bytes_per_sample - 5 * spec.heads * spec.seq ** 2 / t, abs=1)
            else:
                assert q.bwd_time == pytest.approx(p.bwd_time)


def test_selective_re_runs_the_flash_forward():
    """Megatron-Core checkpoints the core attention whatever its kernel: with flash attention, selective
    re-runs the flash kernel's forward before its backward (in I, never W) and stashes Q, K, V without the
    kernel's fp32 row log-sum-exp; full recomputation does not pay that re-run twice."""
    b, t = 2, 8
    for sp in (False, True):
        kw = {"attention": "flash", "sequence_parallel": sp}
        ops = layer_operators(GPT, b, t, OperatorOptions(**kw))
        flash_fwd = sum(k.time(A100, "fp16") for op in ops if op.name == "flash_attn" for k in op.fwd)
        lse = 4.0 * b * (GPT.heads // t) * GPT.seq
        assert saved(GPT, b, t, recompute="selective", **kw) == pytest.approx(saved(GPT, b, t, **kw) - lse)
        a = time_operators(ops, A100, "fp16")
        s = time_operators(layer_operators(GPT, b, t, OperatorOptions(recompute="selective", **kw)), A100, "fp16")
        assert (s.fwd, s.bwd_w, s.rerun) == pytest.approx((a.fwd, a.bwd_w, flash_fwd))
        assert s.bwd_i == pytest.approx(a.bwd_i + flash_fwd)
        assert s.recompute == pytest.approx(a.recompute)


def test_stash_of_gqa_and_swiglu_follows_the_shapes():
    """Issue 12 item 5: a Llama-style layer (GQA, SwiGLU, RMSNorm, no dropout) stashes, per sample, the two
    norm inputs and the two column-parallel GEMM inputs (h each), Q and the attention output (a d), K and V
    (k d each, GQA), the gate and up outputs and their product (f each), and the softmax output (a s^2):
    2 bytes each."""
    spec = ModelSpec(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_mlp=True,
                     activation="silu", norm="rmsnorm", position="rotary", bias=False, vocab=128256, seq=2048)
    s, h, ad, kd, f, a = spec.seq, spec.hidden, spec.q_dim, spec.kv_dim, spec.f, spec.heads
    expect = 2 * s * (4 * h + 2 * ad + 2 * kd + 3 * f) + 2 * a * s * s
    assert saved(spec, dropout=False) == pytest.approx(expect)
    mha = spec.with_(kv_heads=32)
    assert saved(mha, dropout=False) - saved(spec, dropout=False) == pytest.approx(2 * s * 2 * (4096 - 1024))
    # flash attention keeps no s^2 term: Q, K, V (O is the projection's input) and the fp32 log-sum-exp
    flash = saved(spec, dropout=False, attention="flash")
    assert flash == pytest.approx(expect - 2 * a * s * s + 4 * a * s)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_sharded_gemms_keep_the_flops_and_split_the_shapes(t):
    ops1, opst = layer_operators(GPT, 1, 1), layer_operators(GPT, 1, t)
    assert gemm_flops(opst) * t == pytest.approx(gemm_flops(ops1))
    shapes = {op.name: op.fwd[0].gemm for op in opst}
    T, h = GPT.seq, GPT.hidden
    assert shapes["qkv"] == (T, 3 * h // t, h, 1)  # column parallel
    assert shapes["proj"] == (T, h, h // t, 1)  # row parallel
    assert shapes["mlp_up"] == (T, 4 * h // t, h, 1)
    assert shapes["mlp_down"] == (T, h, 4 * h // t, 1)
    assert shapes["scores"] == (GPT.seq, GPT.seq, GPT.d, GPT.heads // t)


def test_backward_split_and_recompute_come_from_the_same_list():
    pt = time_operators(layer_operators(GPT, 1, 8), A100, "fp16")
    assert pt.bwd == pytest.approx(pt.bwd_i + pt.bwd_w)
    assert pt.recompute == pytest.approx(pt.fwd + pt.bwd)
    # the weight gradients are the four weight GEMMs (plus their accumulation), about a third of the backward
    assert 0.3 < pt.bwd_w / pt.bwd < 0.5


def test_small_and_sharded_gemms_run_below_the_large_ones():
    """Per-sample time falls with b (bigger GEMMs run closer to peak), and a t-way shard takes more than
    1/t of the whole layer (smaller GEMMs, replicated norms and dropouts): not one time divided by t."""
    spec = PRESETS["gpt2-medium"]
    one = time_operators(layer_operators(spec, 1), A100, "bf16").fwd
    eight = time_operators(layer_operators(spec, 8), A100, "bf16").fwd
    assert eight / 8 < one
    shard = time_operators(layer_operators(spec, 8, 8), A100, "bf16").fwd
    assert shard > eight / 8 * 1.05


def test_curve_interpolates_in_log_size_and_clamps():
    c = Curve(points=[(1, 0.5), (100, 0.9)])
    assert c(0.01) == 0.5 and c(1e6) == 0.9
    assert c(10) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="strictly increasing"):
        Curve(points=[(10, 0.5), (1, 0.9)])
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        Curve(points=[(1, 1.5)])


def test_device_lookup_measured_points_and_tiles():
    assert get_device("a100").name == "A100-SXM4-80GB" and get_device("NVIDIA H100 80GB HBM3").kind == "gpu"
    with pytest.raises(ValueError, match="unknown device"):
        get_device("TPUv9")
    for dev in shipped_devices():
        assert "peak_flops" in dev.sources and "gemm_efficiency" in dev.sources, dev.name
    # a measured GEMM of the same shape wins over the curve
    dev = A100.model_copy(update={"gemm_points": [GemmPoint(m=64, n=64, k=64, dtype="bf16", seconds=1e-5)]})
    assert dev.gemm_eff(64, 64, 64, 1, "bf16") == pytest.approx(2 * 64**3 / 1e-5 / 312e12)
    no_waves = A100.model_copy(update={"sm_count": None})  # tile quantisation alone
    tiled = no_waves.model_copy(update={"tile": (128, 128)})
    assert tiled.gemm_eff(129, 128, 4096) == pytest.approx(no_waves.gemm_eff(129, 128, 4096) * 129 / 256)
    # a roofline kernel: memory-bound element-wise work takes bytes / achieved bandwidth
    assert A100.kernel_time(0, 1e9) == pytest.approx(1e9 / (A100.memory_bandwidth * 0.9) + A100.kernel_overhead_s)


def _cluster(device: str) -> Cluster:
    return Cluster(name="c", nodes=2, gpus_per_node=8, device=device, memory_bytes=80 * 2**30, peak_flops=100e12,
                   intra=Link(alpha=1e-6, beta=1e-11), inter=Link(alpha=1e-5, beta=1e-10))


def test_cluster_names_its_device_or_gets_a_generic_one():
    assert device_for_cluster(_cluster("A100-SXM4-80GB")) is get_device("A100-SXM4-80GB")
    gen = device_for_cluster(_cluster("MysteryGPU"))
    assert gen.peak("bf16") == 100e12 and "generic" in gen.notes


def test_shard_times_schema():
    with pytest.raises(ValueError, match="both or neither"):
        ShardTimes(fwd_time={1: 1.0}, bwd_time={1: 2.0}, bwd_input_time={1: 1.0})
    st = ShardTimes(fwd_time={1: 1.0, 2: 1.5}, bwd_time={1: 2.0, 2: 3.0})
    assert st.time("bwd_weight", 2) == 1.5 and st.time("recompute", 1) == 3.0
    old = LayerProfile(name="x", kind="transformer", fwd_time={1: 1.0}, bwd_time={1: 2.0},
                       output_bytes_per_sample=1, stashed_bytes_per_sample=1, input_bytes_per_sample=1, params=1,
                       param_bytes=2)
    assert old.shard_time("fwd", 1, 2) is None
    with pytest.raises(ValueError, match="tensor-parallel size"):
        LayerProfile.model_validate({**old.model_dump(), "tensor_times": {0: st.model_dump()}})


def _costs(prof, t: int, **kw) -> ConfigCosts:
    cfg = Config(tensor=t, pipeline=2, data=1, micro_batch=2, schedule=kw.pop("schedule", "1f1b"), **kw)
    n = len(prof.layers)
    return ConfigCosts(prof, _cluster("A100-SXM4-80GB"), TrainingRequest(global_batch=8), cfg,
                       build(cfg.schedule, 2, 4), [(0, n // 2), (n // 2, n)])


def test_costs_use_per_t_times_and_say_so():
    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2, 4), tensor_sizes=(1, 4))
    c4 = _costs(prof, 4)
    assert c4.compute_source == "per-t operators"
    layers = prof.layers[c4.stages[1].layers[0]:c4.stages[1].layers[1]]
    shard = sum(x.shard_time("fwd", 2, 4) for x in layers)
    nbytes = 2 * prof.shape.seq * prof.shape.hidden * 2
    comm = 2 * c4.stages[1].transformer_layers * collective_time(c4.cluster, "intra", "all_reduce", 4, nbytes)
    # the last stage's cross-entropy
    loss = 3 * collective_time(c4.cluster, "intra", "all_reduce", 4, 2 * prof.shape.seq * 4.0)
    assert c4.fwd(1) == pytest.approx(shard + comm + loss)
    # the zero-bubble split is the profile's: W = the weight-gradient kernels
    zb = _costs(prof, 4, schedule="zb-h1")
    w = sum(x.shard_time("bwd_weight", 2, 4) for x in layers)
    assert zb.compute("W", 1, 1, 1) == pytest.approx(w)
    assert zb.compute("I", 1, 1, 1) + zb.compute("W", 1, 1, 1) == pytest.approx(zb.bwd(1))
    # no times at t = 2: the scaled t = 1 path, named as such
    assert _costs(prof, 2).compute_source == "t=1 / (t * tensor_efficiency)"
    # sequence parallelism: all-gather + reduce-scatter in place of each all-reduce
    sp = prof.model_copy(update={"environment": {**prof.environment, "sequence_parallel": "true"}})
    c_sp = _costs(sp, 4)
    gather = collective_time(c4.cluster, "intra", "all_gather", 4, nbytes)  # + the LM head's input all-gather
    assert c_sp.fwd(1) - shard == pytest.approx(2 * c4.stages[1].transformer_layers * 2 * gather + gather + loss)


def test_embedding_and_head_tensor_parallel_collectives():
    """Megatron's vocabulary-parallel embedding all-reduces its output in the forward; the LM head's input
    gradient is all-reduced in the backward, and the cross-entropy all-reduces three b s fp32 vectors in
    the forward: the first stage's F and the last stage's B carry one b s h all-reduce more than their
    transformer layers', and nothing changes at t = 1."""
    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2, 4), tensor_sizes=(1, 4))
    c4 = _costs(prof, 4)
    nbytes = 2 * prof.shape.seq * prof.shape.hidden * 2
    one = collective_time(c4.cluster, "intra", "all_reduce", 4, nbytes)
    assert c4.stages[0].has_embedding and not c4.stages[0].has_head
    assert c4.stages[1].has_head and not c4.stages[1].has_embedding
    for stage in (0, 1):
        layers = prof.layers[c4.stages[stage].layers[0]:c4.stages[stage].layers[1]]
        shard_f = sum(x.shard_time("fwd", 2, 4) for x in layers)
        shard_b = sum(x.shard_time("bwd", 2, 4) for x in layers)
        body = 2 * c4.stages[stage].transformer_layers * one
        loss = 3 * collective_time(c4.cluster, "intra", "all_reduce", 4, 2 * prof.shape.seq * 4.0)
        assert c4.fwd(stage) == pytest.approx(shard_f + body + (one if stage == 0 else loss))
        assert c4.bwd(stage) == pytest.approx(shard_b + body + (one if stage == 1 else 0.0))
    c1 = _costs(prof, 1)
    assert c1._tp_edges(0, 2, backward=False) == 0.0 and c1._tp_edges(1, 2, backward=True) == 0.0


@pytest.mark.parametrize("recompute", [False, True])
def test_sequence_parallel_backward_regathers_the_column_parallel_inputs(recompute):
    """With sequence parallelism Megatron stashes the T/t-row shard of the QKV and MLP-up (and LM head) GEMM
    inputs and all-gathers it again for the weight gradient (Korthikanti et al. 2022, 4.2.2), with or without
    full recomputation: per backward two b s h all-gathers per transformer layer and one for the head; the
    forward is unchanged and the full-recomputation extra is the re-run forward alone."""
    opts = OperatorOptions(sequence_parallel=True)
    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(2,), tensor_sizes=(1, 4), options=opts)
    c4 = _costs(prof, 4, recompute=recompute)
    ag = collective_time(c4.cluster, "intra", "all_gather", 4, 2 * prof.shape.seq * prof.shape.hidden * 2)
    for stage in (0, 1):
        info = c4.stages[stage]
        want = (2 * info.transformer_layers + (1 if info.has_head else 0)) * ag
        assert c4._sp_regather(stage, 2) == pytest.approx(want)
        layers = prof.layers[info.layers[0]:info.layers[1]]
        kind = "recompute" if recompute else "bwd"
        comm = c4._tp_comm(stage, 2) * (2 if recompute else 1) + c4._tp_edges(stage, 2, backward=True)
        assert c4.bwd(stage) == pytest.approx(sum(x.shard_time(kind, 2, 4) for x in layers) + comm + want)
        extra = sum(x.shard_time("fwd", 2, 4) for x in layers if x.kind == "transformer") + c4._tp_comm(stage, 2)
        assert c4.recompute_extra(stage) == pytest.approx(extra if recompute else 0.0)
    plain = _costs(analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(2,), tensor_sizes=(1, 4)), 4)
    assert plain._sp_regather(1, 2) == 0.0


def test_costs_with_per_t_times_on_some_layers_only():
    """A measured profile may time only the transformer layers per t: the others are scaled, and the
    candidate says so."""
    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2, 4), tensor_sizes=(1, 4))
    layers = [x if x.kind == "transformer" else x.model_copy(update={"tensor_times": None}) for x in prof.layers]
    part = prof.model_copy(update={"layers": layers})
    c = _costs(part, 4)
    assert c.compute_source == "per-t operators (other layers: t=1 / (t * tensor_efficiency))"
    emb = part.layers[0]
    full = _costs(prof, 4)
    assert c.fwd(0) - full.fwd(0) == pytest.approx(
        emb.time("fwd", 2) / (4 * 0.95) - prof.layers[0].shard_time("fwd", 2, 4))


def test_measured_shard_times_are_used_and_named():
    """What ``pipeplan profile --tensor`` writes (source "measured") takes the place of the operator model."""
    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2), tensor_sizes=(1, 2))
    doubled = []
    for x in prof.layers:
        st = x.tensor_times[2]
        meas = st.model_copy(update={"source": "measured", "fwd_time": {b: 2 * v for b, v in st.fwd_time.items()}})
        doubled.append(x.model_copy(update={"tensor_times": {1: x.tensor_times[1], 2: meas}}))
    measured = prof.model_copy(update={"layers": doubled})
    c, base = _costs(measured, 2), _costs(prof, 2)
    assert c.compute_source == "per-t measured"
    layers = prof.layers[c.stages[0].layers[0]:c.stages[0].layers[1]]
    assert c.fwd(0) - base.fwd(0) == pytest.approx(sum(x.shard_time("fwd", 2, 2) for x in layers))


def test_stage_memory_uses_the_shard_stash():
    """Stash and the recomputation working set (largest layer) of a stage come from the per-t shard."""
    from planner.cost import stage_infos

    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1,), tensor_sizes=(1, 4))
    info = stage_infos(prof, [(1, 5)], 4)[0]
    block = prof.layers[1].tensor_times[4].stashed_bytes_per_sample
    assert info.stash_bytes == pytest.approx(4 * block) and info.recompute_working_bytes == pytest.approx(block)
    s, h, a = 1024, 1024, 16
    assert block == pytest.approx(s * h * (10 + 24 / 4 + 5 * a * s / (h * 4)))  # eq. 2, bytes per sample


def test_tensor_parallel_across_nodes_is_hierarchical():
    """t = 16 on 8-GPU nodes: reduce-scatter and all-gather over NVLink, the inter-node all-reduce on 1/8
    of the bytes (NCCL's rings cross nodes on every GPU's own NIC), as the data-parallel reduction."""
    from planner.cost import allreduce_time

    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(2,), tensor_sizes=(1, 16))
    c = _costs(prof, 16)
    layers = prof.layers[c.stages[1].layers[0]:c.stages[1].layers[1]]
    shard = sum(x.shard_time("fwd", 2, 16) for x in layers)
    nbytes = 2 * prof.shape.seq * prof.shape.hidden * 2
    one = allreduce_time(c.cluster, list(range(16)), nbytes)
    loss = 3 * allreduce_time(c.cluster, list(range(16)), 2 * prof.shape.seq * 4.0)  # the cross-entropy's
    assert c.fwd(1) == pytest.approx(shard + 2 * c.stages[1].transformer_layers * one + loss)
    assert one < ring_allreduce(16, nbytes, c.cluster.inter)


def test_wave_quantisation_on_the_a100():
    """108 SMs, 256 x 128 tiles (NVIDIA Matrix Multiplication Background guide, 3.2): 108 full tiles fill
    one wave exactly; one tile more needs a second, nearly empty wave; a partial edge tile wastes its pad."""
    from planner.device import get_device

    dev = get_device("A100-SXM4-80GB")
    assert dev.quantisation(256 * 9, 128 * 12) == pytest.approx(1.0)
    assert dev.quantisation(256 * 109, 128) == pytest.approx(109 / 216, rel=1e-6)
    assert dev.quantisation(256 * 9, 128 * 12 - 64) < 1.0
    base = dev.model_copy(update={"sm_count": None, "tile": None})
    assert base.quantisation(256 * 109, 128) == 1.0
    assert dev.gemm_eff(256 * 109, 128, 8192) < base.gemm_eff(256 * 109, 128, 8192)


@pytest.mark.parametrize(("name", "shape", "tflops"), [
    ("A100-SXM4-80GB", (6912, 16384, 2048), 267.9),  # MAMF table (stas00/ml-engineering), bf16, best shape
    ("A100-SXM4-40GB", (6912, 16384, 2048), 267.9),  # the same chip and clocks: the 80 GB part's figure
    # the H100's curve is measured whole kernels instead (tests/test_h100_layers.py checks it against them)
])
def test_shipped_gemm_ceiling_reproduces_the_measured_mamf(name, shape, tflops):
    """The shipped GEMM curves are anchored on a measured best-shape GEMM through the device's own kernel-time
    rule (no_overlap: tensor-core time + operand/output streaming + launch): timing that GEMM with the
    description at its burst rate gives the measured TFLOP/s back, and the derivation inverts the rule. A
    device that states a power-limited ``sustained_rate`` (the H100) runs the same GEMM at that fraction of it
    in a training run."""
    from planner.device import ceiling_for_measurement

    sustained = get_device(name)
    dev = sustained.model_copy(update={"sustained_rate": 1.0})
    m, n, k = shape
    flops = 2.0 * m * n * k
    secs = dev.kernel_time(flops, 2.0 * (m * k + k * n + m * n), gemm=(m, n, k, 1), dtype="bf16")
    assert flops / secs / 1e12 == pytest.approx(tflops, rel=2e-3)
    secs = sustained.kernel_time(flops, 2.0 * (m * k + k * n + m * n), gemm=(m, n, k, 1), dtype="bf16")
    assert flops / secs / 1e12 == pytest.approx(tflops * sustained.sustained_rate, rel=2e-3)
    assert dev.processing == "no_overlap"
    top = dev.gemm_efficiency["bf16"].points[-1][1]
    assert ceiling_for_measurement(dev, m, n, k, tflops) == pytest.approx(top, rel=1e-3)
    # under a roofline rule the same measurement means a lower ceiling (no memory term to subtract)
    roof = dev.model_copy(update={"processing": "roofline"})
    assert ceiling_for_measurement(roof, m, n, k, tflops) < top


@pytest.mark.parametrize(("name", "tflops"), [("A100-SXM4-80GB", 267.9), ("H100-SXM5-80GB", 814.87)])
def test_no_gemm_is_timed_faster_than_the_measured_mamf(name, tflops):
    """A sweep's maximum achievable matmul FLOPS is the fastest any GEMM ran: every GEMM kernel of the shipped
    A100 takes at least flops / MAMF, the H100's at least flops / its fastest measured GEMM (fp16 shares bf16's
    figure), at the device's sustained rate; the rule is max(curve rule, cap), and on the A100 the cap binds on
    some large shapes (the no_overlap rule's memory term is small per FLOP at large k)."""
    import itertools

    dev = get_device(name)
    assert dev.gemm_ceiling("bf16") == dev.gemm_ceiling("fp16") == pytest.approx(tflops * 1e12)
    cap = tflops * 1e12 * dev.sustained_rate  # the burst MAMF at the power-limited rate the device states
    assert "MAMF" in dev.sources["gemm_ceiling_flops"]  # the H100's cites it for comparison
    uncapped = dev.model_copy(update={"gemm_ceiling_flops": {}})
    assert uncapped.gemm_ceiling("bf16") is None
    binds = 0
    for m, n, k in itertools.product((512, 2048, 8192, 32768), repeat=3):
        flops, nbytes = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
        t = dev.kernel_time(flops, nbytes, gemm=(m, n, k, 1), dtype="fp16")
        free = uncapped.kernel_time(flops, nbytes, gemm=(m, n, k, 1), dtype="fp16")
        assert flops / t <= cap * (1 + 1e-12)
        assert t == pytest.approx(max(free, flops / cap), rel=1e-12)
        binds += free < flops / cap
    # the cap binds on some large shapes under the no_overlap rule (the A100's); the H100's measured curve tops at
    # 0.81-0.83 of its peak, at or just under its fastest measured GEMM, so it seldom does
    assert binds > 0 or dev.processing == "roofline"
    # element-wise kernels and devices without a published MAMF are not capped
    assert dev.kernel_time(1e9, 1e6) == uncapped.kernel_time(1e9, 1e6)
    assert get_device("V100-SXM2-32GB").gemm_ceiling("fp16") is None


def test_gemm_ceiling_must_be_a_figure_of_the_device():
    from planner.device import DeviceSpec

    a100 = get_device("A100-SXM4-80GB").model_dump()
    with pytest.raises(ValueError, match="above the bf16 peak"):
        DeviceSpec(**{**a100, "gemm_ceiling_flops": {"bf16": 400e12}})
    with pytest.raises(ValueError, match="no peak for dtype"):
        DeviceSpec(**{**a100, "gemm_ceiling_flops": {"fp8": 100e12}})


def fwd_rate_at(dev) -> float:
    """TFLOP/s of GPT-3 175B's causal FlashAttention-2 forward at t = 6, micro-batch 8 on ``dev``: 16 heads of
    128 over 16k tokens, the FlashAttention-3 paper's shape."""
    fwd, _ = _flash(PRESETS["gpt3-175b"], 8, 6, causal=True)
    return fwd.flops / fwd.time(dev, "bf16") / 1e12


def _flash(spec: ModelSpec, b: int, t: int, **opts):
    ops = layer_operators(spec, b, t, OperatorOptions(attention="flash", **opts))
    (op,) = [o for o in ops if o.name == "flash_attn"]
    return op.fwd[0], op.bwd_i[0]


def test_flash_kernel_runs_at_the_published_rate_of_its_implementation():
    """GPT-3 175B's flash kernel at t = 6, micro-batch 8 (16 heads of d = 128, 8 sequences of 2048: the papers'
    shape) on the H100 runs at FlashAttention-3 paper figure 5's bar for its implementation (causal forward
    at 2k: FA2 298, FA3 521, cuDNN 484 TFLOP/s; unmasked FA2 362); the causal backward, which the papers do
    not publish, at the rate measured on an H100 (FA2 189 TFLOP/s at 2k; the unmasked figure 6 bar, 291, was
    used before); before that, on the GEMM curve, it ran at 520 / 592 TFLOP/s. FLOPs as the papers count
    them. These are burst rates: in a training run the H100 runs them at its power-limited
    ``sustained_rate``. Fewer heads per GPU fill the SMs less evenly (tests/test_attention_waves.py): at t = 4,
    micro-batch 1 (24 heads of one sequence) the same kernels run at 0.76-0.78 of these rates."""
    sustained = get_device("H100-SXM5-80GB")
    h100 = sustained.model_copy(update={"sustained_rate": 1.0})
    assert fwd_rate_at(sustained) == pytest.approx(298 * 0.86, rel=1e-3)
    spec = PRESETS["gpt3-175b"]
    fwd, bwd = _flash(spec, 8, 6, causal=True)
    assert fwd.flops == pytest.approx(0.5 * 4 * 8 * 16 * 2048**2 * 128) and bwd.flops == pytest.approx(2.5 * fwd.flops)
    few_f, few_b = _flash(spec, 1, 4, causal=True)
    for k, few in ((fwd, few_f), (bwd, few_b)):
        slower = (k.flops / k.time(h100, "bf16")) / (few.flops / few.time(h100, "bf16"))
        assert 1.25 < slower < 1.35, (k.name, slower)
    assert fwd.attention == ("flash2", True, False) and bwd.attention == ("flash2", True, True)
    rate = {k.name: k.flops / k.time(h100, "bf16") / 1e12 for k in (fwd, bwd)}
    assert rate["flash_attn"] == pytest.approx(298, rel=1e-3)
    assert rate["flash_attn.bwd"] == pytest.approx(189, rel=1e-3)
    _, nc = _flash(spec, 8, 6, causal=False)
    assert nc.flops / nc.time(h100, "bf16") / 1e12 == pytest.approx(291, rel=1e-3)
    for impl, want in (("flash3", 521), ("cudnn", 484)):
        f, _ = _flash(spec, 8, 6, causal=True, attention_impl=impl)
        assert f.flops / f.time(h100, "bf16") / 1e12 == pytest.approx(want, rel=1e-3), impl
    f, _ = _flash(spec, 8, 6, causal=False)
    assert f.flops / f.time(h100, "bf16") / 1e12 == pytest.approx(362, rel=1e-3)
    # flat outside the published lengths; the GEMM rule (what the kernel was timed by before) is faster
    assert h100.attention_efficiency["flash2"].efficiency(65536, backward=False, causal=False) == pytest.approx(
        370 / 989.4, abs=1e-4)
    assert fwd.time(h100, "bf16") > h100.kernel_time(fwd.flops, fwd.nbytes, gemm=fwd.gemm)
    # the A100: FlashAttention-2's stated maxima, 73% forward and 63% backward of 312 TFLOP/s
    a100 = get_device("A100-SXM4-80GB")
    assert fwd.flops / fwd.time(a100, "bf16") == pytest.approx(0.73 * 312e12, rel=1e-6)
    assert bwd.flops / bwd.time(a100, "bf16") == pytest.approx(0.63 * 312e12, rel=1e-6)


def test_flash_kernel_without_published_figures_falls_back_to_the_gemm_curve():
    """An implementation the device has no figures for (FlashAttention-3 on the Ampere A100, any on the V100),
    or a dtype the figures are not for (fp32), is timed on the GEMM curve as before."""
    spec = PRESETS["gpt2-medium"]
    for name, impl, dtype in (("A100-SXM4-80GB", "flash3", "bf16"), ("V100-SXM2-32GB", "flash2", "fp16")):
        dev = get_device(name)
        fwd, _ = _flash(spec, 2, 1, causal=True, attention_impl=impl)
        assert dev.attention_time(fwd.flops, impl, 1024, backward=False, causal=True, dtype=dtype) is None
        assert fwd.time(dev, dtype) == dev.kernel_time(fwd.flops, fwd.nbytes, gemm=fwd.gemm, dtype=dtype)
    assert get_device("H100-SXM5-80GB").attention_time(1e9, "flash2", 1024, backward=False, causal=True,
                                                        dtype="fp32") is None


def test_attention_implementation_is_stated_in_the_profile():
    """A flash profile records its implementation (default FlashAttention-2); an unfused one does not."""
    flash = analytic_profile(PRESETS["gpt2-medium"], "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1,),
                             options=OperatorOptions(attention="flash", causal=True))
    assert flash.environment["attention_impl"] == "flash2" and "(flash2)" in flash.notes
    cudnn = analytic_profile(PRESETS["gpt2-medium"], "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1,),
                             options=OperatorOptions(attention="flash", causal=True, attention_impl="cudnn"))
    assert cudnn.environment["attention_impl"] == "cudnn"
    assert cudnn.layers[1].fwd_time[1] < flash.layers[1].fwd_time[1]  # cuDNN's is the faster kernel on H100
    unfused = analytic_profile(PRESETS["gpt2-medium"], "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1,))
    assert "attention_impl" not in unfused.environment


def test_attention_figures_name_a_known_implementation():
    from planner.device import DeviceSpec

    h100 = get_device("H100-SXM5-80GB").model_dump()
    with pytest.raises(ValueError, match="unknown implementation 'flash4'"):
        DeviceSpec(**{**h100, "attention_efficiency": {"flash4": h100["attention_efficiency"]["flash2"]}})
    assert "FlashAttention-3" in get_device("H100-SXM5-80GB").sources["attention_efficiency"]
    assert "FlashAttention-2" in get_device("A100-SXM4-80GB").sources["attention_efficiency"]


def test_full_recomputation_reruns_the_transformer_layers_only():
    """Megatron's --checkpoint-activations wraps the transformer layers (ParallelTransformer's checkpointed
    forward); the embedding and the LM head with its loss run once, so their recompute time is their backward."""
    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2), tensor_sizes=(1, 2))
    for lay in prof.layers:
        for t in (1, 2):
            st = lay.tensor_times[t]
            want = {b: st.fwd_time[b] + st.bwd_time[b] for b in (1, 2)} if lay.kind == "transformer" \
                else st.bwd_time
            assert st.recompute_time == pytest.approx(want), (lay.name, t)
    assert {lay.kind for lay in prof.layers} == {"embedding", "transformer", "lm_head"}


def test_blocking_p2p_holds_the_sender_and_is_not_counted_twice():
    """Megatron 2021's runtime (environment p2p = blocking, p2p_scatter_gather = on) returns from a send only
    once the transfer of its 1/t share and the scatter/gather all-gather are done: F of stage 0 grows by that
    time and the message then takes no further time; a non-blocking runtime sends in the background (F
    unchanged, the message takes the link)."""
    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2), tensor_sizes=(1, 2))
    sg = {**prof.environment, "p2p_scatter_gather": "on"}
    plain = _costs(prof.model_copy(update={"environment": sg}), 2)
    held = _costs(prof.model_copy(update={"environment": {**sg, "p2p": "blocking"}}), 2)
    full = plain.stages[0].out_bytes * 2
    send = plain.send_time(0, 1, full / 2) + collective_time(plain.cluster, "intra", "all_gather", 2, full)
    assert held.fwd(0) - plain.fwd(0) == pytest.approx(send)
    assert plain.p2p("SEND_F", 0, 1, 0, 1) == pytest.approx(plain.send_time(0, 1, full / 2))
    assert plain.p2p("SEND_F", 0, 1, 0, 1) > 0
    assert held.p2p("SEND_F", 0, 1, 0, 1) == 0.0


def test_each_tensor_rank_sends_the_whole_boundary_tensor_without_sequence_parallelism():
    """Without scatter/gather (pipeplan's executor, Megatron-Core) every one of the t ranks sends the whole
    boundary tensor it holds, and a blocking send gathers nothing; under sequence parallelism each rank holds
    and sends its 1/t of the sequence, gathering nothing either (Megatron-LM 2022 turns scatter/gather off
    there). The emulated executor moves messages of that size."""
    from executor.emulate import Emulator

    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2), tensor_sizes=(1, 2))
    sp = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2), tensor_sizes=(1, 2),
                          options=OperatorOptions(sequence_parallel=True))
    for p, share in ((prof, 1), (sp, 2)):
        plain = _costs(p, 2)
        held = _costs(p.model_copy(update={"environment": {**p.environment, "p2p": "blocking"}}), 2)
        full = plain.stages[0].out_bytes * 2
        assert plain.p2p_share == share
        assert plain.p2p("SEND_F", 0, 1, 0, 1) == pytest.approx(plain.send_time(0, 1, full / share))
        assert held.fwd(0) - plain.fwd(0) == pytest.approx(plain.send_time(0, 1, full / share))
        assert Emulator.message_bytes(SimpleNamespace(costs=plain), "RECV_F", 1, 1) == int(full / share)
    whole = _costs(prof, 2)
    with_sg = _costs(prof.model_copy(update={"environment": {**prof.environment, "p2p_scatter_gather": "on"}}), 2)
    assert whole.p2p("SEND_F", 0, 1, 0, 1) > with_sg.p2p("SEND_F", 0, 1, 0, 1)


def test_ddp_overlap_leaves_only_what_exceeds_the_last_backward():
    """PyTorch DDP (environment dp_allreduce = overlapped) all-reduces its 25 MB buckets during the backward of
    the synchronising micro-batch: a one-stage pipeline keeps the last bucket after it, plus what the buckets
    before it take from the backward they run beside (planner.contention: share x their time, where they fit
    under it); Megatron's own DDP (the default) all-reduces after the backward, all of it exposed."""
    from planner.cost import DDP_BUCKET_BYTES, allreduce_time

    prof = analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1, 2), tensor_sizes=(1,))
    cfg = Config(tensor=1, pipeline=1, data=16, micro_batch=2, schedule="1f1b", recompute=True)
    n = len(prof.layers)

    def costs(p):
        return ConfigCosts(p, _cluster("A100-SXM4-80GB"), TrainingRequest(global_batch=64), cfg,
                           build("1f1b", 1, 2), [(0, n)])

    plain = costs(prof)
    over = costs(prof.model_copy(update={"environment": {**prof.environment, "dp_allreduce": "overlapped"}}))
    whole = plain.allreduce(0, 0, 0)
    ranks = [plain.rank(0, w) for w in range(16)]
    assert whole == pytest.approx(allreduce_time(plain.cluster, ranks, plain.stages[0].param_bytes))
    bucket = allreduce_time(plain.cluster, ranks, DDP_BUCKET_BYTES)
    assert whole - bucket < over.bwd(0)  # the buckets before the last fit under the backward
    assert over.allreduce(0, 0, 0) == pytest.approx(bucket + over.comm_share * (whole - bucket))
    assert over.comm_share == pytest.approx(24 / 108)
    assert over.allreduce(0, 0, 0) < whole


def test_flash_mask_follows_the_architecture():
    """A decoder's flash kernel is the causal one whatever the options say (the CLI's and the API's
    ``--attention flash`` name no mask): half the attention FLOPs of an encoder's of the same shape."""
    h100 = get_device("H100-SXM5-80GB")
    dec = PRESETS["gpt2-medium"].model_copy(update={"seq": 8192})
    enc = dec.model_copy(update={"architecture": "encoder"})

    def attn_fwd(spec: ModelSpec, causal: bool) -> float:
        prof = analytic_profile(spec, h100, micro_batches=(1,), tensor_sizes=(1,),
                                options=OperatorOptions(attention="flash", causal=causal))
        return prof.layers[1].fwd_time[1]

    assert attn_fwd(dec, False) == attn_fwd(dec, True)  # the option cannot make a decoder's mask full
    assert attn_fwd(enc, True) == attn_fwd(enc, False)
    assert attn_fwd(enc, False) > attn_fwd(dec, False) * 1.1  # s = 8192: the s^2 kernel is a large share


def test_rotary_and_query_key_norms_are_operators():
    """A rotary model rotates its queries and keys (a memory-bound kernel over this rank's ``(a + k) d`` columns,
    saving nothing); Qwen3's per-head query/key RMSNorm is another, saving its input; a learned-position GPT has
    neither. The layer's parameters count the norms' two ``d`` weights."""
    from profiler.hf_config import read_hf_config

    models = Path(__file__).resolve().parent.parent / "examples" / "models"
    qwen3 = read_hf_config(models / "qwen3-8b", seq=4096)
    llama = read_hf_config(models / "llama-3.1-8b", seq=4096)
    b, t = 1, 2
    ops = {op.name: op for op in layer_operators(qwen3, b, t)}
    elements = b * qwen3.seq * (qwen3.heads // t + qwen3.k // t) * qwen3.d
    assert ops["rope"].saved_bytes == 0 and ops["rope"].fwd[0].nbytes == 2 * 2 * elements
    assert ops["qk_norm"].saved_bytes == 2 * elements
    assert "qk_norm" not in {op.name for op in layer_operators(llama, b, t)}
    assert "rope" in {op.name for op in layer_operators(llama, b, t)}
    assert not {"rope", "qk_norm"} & {op.name for op in layer_operators(GPT, b, t)}
    assert qwen3.layer_params() - qwen3.model_copy(update={"qk_norm": False}).layer_params() == 2 * qwen3.d


def test_a_flash_kernel_the_device_does_not_run_is_refused():
    """FlashAttention-3 is Hopper's: an A100 profile asking for it is refused, naming the field and what the device
    has; a device without kernel figures (V100) times any flash kernel on its GEMM curve."""
    with pytest.raises(ValueError, match="attention_impl: A100-SXM4-80GB has no figures for flash3.*has flash2"):
        analytic_profile(PRESETS["gpt2-medium"], A100, micro_batches=(1,), tensor_sizes=(1,),
                         options=OperatorOptions(attention="flash", attention_impl="flash3"))
    v100 = analytic_profile(PRESETS["gpt2-medium"], "V100-SXM2-32GB", dtype="fp16", micro_batches=(1,),
                            tensor_sizes=(1,), options=OperatorOptions(attention="flash", attention_impl="flash3"))
    assert v100.environment["attention_impl"] == "flash3"


@pytest.mark.parametrize("kernels", ["fused", "eager"])
def test_gemma2_norms_and_soft_caps_are_operators(kernels):
    """Gemma 2's norm on each branch's output saves its input (two more norms' parameters); the scores' soft-cap
    is a pass over this rank's ``b a/t s^2`` scores before the unfused softmax, saving its ``tanh`` output (none
    under the flash kernel, which caps in-kernel); the logits' cap one over the ``T V/t`` logits; the embeddings'
    scale one over ``T h``, saving nothing. Without the four flags the lists are Gemma 1's / Llama's."""
    from planner.operators import embedding_operators, head_operators
    from profiler.hf_config import read_hf_config

    g = read_hf_config(Path(__file__).resolve().parent.parent / "examples" / "models" / "gemma-2-9b", seq=2048)
    plain = g.model_copy(update={"sandwich_norm": False, "attention_softcap": None, "logit_softcap": None,
                                 "embedding_scale": False})
    b, t, s, el = 1, 2, g.seq, 2
    opts = OperatorOptions(kernels=kernels)
    ops = {op.name: op for op in layer_operators(g, b, t, opts)}
    base = {op.name: op for op in layer_operators(plain, b, t, opts)}
    assert set(ops) - set(base) == {"post_attn_norm", "post_mlp_norm", "attn_softcap"}
    assert ops["post_attn_norm"].saved_bytes == ops["norm1"].saved_bytes > 0
    scores = b * (g.heads // t) * s * s
    assert ops["attn_softcap"].saved_bytes == el * scores
    assert sum(k.nbytes for k in ops["attn_softcap"].fwd) == (6 if kernels == "eager" else 2) * el * scores
    flash = {op.name for op in layer_operators(g, b, t, OperatorOptions(kernels=kernels, attention="flash"))}
    assert "attn_softcap" not in flash and "post_mlp_norm" in flash
    head = {op.name: op for op in head_operators(g, b, t, opts)}
    assert head["logit_softcap"].saved_bytes == el * b * s * (-(-g.vocab // t))
    assert "logit_softcap" not in {op.name for op in head_operators(plain, b, t, opts)}
    emb = {op.name: op for op in embedding_operators(g, b, t, opts)}
    assert emb["embedding_scale"].saved_bytes == 0
    assert "embedding_scale" not in {op.name for op in embedding_operators(plain, b, t, opts)}
    assert g.layer_params() - plain.layer_params() == 2 * g.hidden
    fwd = time_operators(list(ops.values()), A100, "bf16").fwd
    assert fwd > time_operators(list(base.values()), A100, "bf16").fwd


def test_window_share_counts_the_pairs_a_windowed_causal_kernel_computes():
    """The (query, key) pairs within a window of ``w`` keys (the query itself included), counted one by one, over
    ``s^2``; a window spanning the sequence is the causal half (the FLOP convention), no mask all of it."""
    from planner.operators import window_share

    for s, w in ((8, 3), (16, 1), (64, 17), (10, 10)):
        pairs = sum(1 for i in range(s) for j in range(s) if 0 <= i - j < w)
        expect = pairs / s**2 if w < s else 0.5
        assert window_share(s, w, causal=True) == pytest.approx(expect)
    assert window_share(64, None, causal=True) == 0.5 and window_share(64, 8, causal=False) == 1.0
