"""Predicted against measured on H100: NVIDIA's published DGX H100 BF16 runs (tests/data/h100_public_runs.json).

NVIDIA/dgxc-benchmarking @ 143b90dd ("Expected Performance", BF16, DGX H100, NeMo Megatron): GPT-3 175B (t 4, p 8,
VP 12, 128-2048 GPUs), Nemotron-4 15B (t 4, p 1, MBS 4, 16-2048 GPUs), Nemotron-4 340B (t 8, p 8, VP 12,
128-2048 GPUs); 18 rows, CP = 1, no FSDP, no experts. (The Megatron-Bridge and NeMo performance summaries
publish their dense DGX-H100 rows in FP8 only.)

Reached with the shipped H100 description and DGX H100 cluster, each row in its stated configuration (``python
benchmarks/fidelity_h100_bench.py``): every tensor-parallel collective costed on the critical path (the recipes of
175B and 15B overlap theirs with the GEMMs, which is not modelled), every GEMM capped at the H100's measured maximum
achievable matmul FLOPS (792.1 TFLOP/s), the flash kernel at the published rate of the recipe's implementation
(FlashAttention-2 for 175B, cuDNN's fused attention for Nemotron-4: the FlashAttention-3 paper's figures 5 and 6),
the pipeline sends blocking where the recipe batches them without overlapping them (340B: Megatron-Core waits on the
batched requests and synchronizes the device), 340B's selective recomputation re-running the flash forward
(Megatron-Core checkpoints the core attention whatever its kernel), the distributed optimizer (the request's
``shard_optimizer``) stepping its shard only (the mixed-precision gradient passes too, as Megatron-Core's and Apex's
distributed optimizers make them over the shard) and synchronising by a gradient reduce-scatter and a weight
all-gather (NCCL's rings), the rotary kernel on Nemotron-4's queries and keys, and what the distributed optimizer's
overlapped reduce-scatter and all-gather take from the compute beside them (:mod:`planner.contention`), and the
H100 measured on a lent H100 (the device file's sources; tests/test_h100_layers.py checks the GEMMs and the layers
themselves against it): its GEMM curve from GEMMs timed there (roofline, no wave quantisation), its power limit
(GEMM and attention kernels at ``sustained_rate`` 0.86 of their burst rate), its causal attention backward and the
flash kernel's load balance over the SMs at a few heads per GPU (:mod:`planner.attention_waves`; 175B's 24 heads
of one sequence run at 0.76-0.78 of the papers' shape's rate, 340B's 12 at 0.76-0.79, as measured there), and
the clock each step holds under the power limit by its busy share (:mod:`planner.power`: 175B and 15B hold
0.90-0.91 of the burst rate, 340B, about 70% busy, 0.98-0.99).
Median |error| 1.5%, worst 11.2% (175B -9.8..-11.2%, 15B -0.8..+3.0%, 340B -1.7..+0.3%) since the runs are placed
in NeMo's rank order (Megatron-Core's default tp-cp-ep-dp-pp, the pipeline outermost: :mod:`planner.placement`).
175B's t = 4 puts two of a stage's data-parallel copies in a node, where pipeplan's own order had put one: its
distributed optimizer's exposed reduce-scatter and all-gather fell from 0.47 to 0.24 s of 8.2 s (512 GPUs), and
its sends now cross nodes. Nothing else changed; 175B's 8-9% was partly that misplacement, the rest unexplained.
In pipeplan's order (tp-pp-dp): 1.5% / 9.2% (175B -8.1..-9.2%) since 340B's blocking
sends gather nothing (its sequence parallelism sends each rank's 1/t of the sequence, which the next stage takes
as it is: :class:`planner.cost.ConfigCosts`, ``scatter_gather``); with an all-gather of the whole boundary tensor
charged per send it was 2.3% / 9.2% (340B +1.0..+3.1%). At the busy-throughout
rate (no held clock) 5.0% / 12.9% (175B -4.0..-5.1%, 15B +2.8..+6.7%, 340B +10.7..+12.9%); before the load
balance 5.4% / 11.9% (175B -5.2..-6.3%, 15B +2.6..+6.5%, 340B +9.7..+11.9%). With the power limit on
the old GEMM rule (Calculon's curve scaled to the MAMF, no_overlap, wave quantisation): 6.6% / 14.1% (175B
-1.9..-3.1%, 15B +4.7..+8.8%, 340B +11.8..+14.1%). Before the power limit: 5.1% / 13.7% (175B -12.6..-13.7%, 15B
-3.1..-6.7%, 340B +1.2..+3.2%): the layers were 15-17% fast against the measured ones, and the errors of the
multi-GPU terms hid it (15B's recipe overlaps its TP collectives, 18% of its prediction, which is not modelled;
340B, 70-80% busy, holds a higher clock than a GPU busy throughout: benchmarks/fidelity_h100_bench.py estimates it).
6.1% median before the contention
(15B -4.0..-7.7%); with the gradient passes over the whole model, an all-reduce and no rotary kernel 5.9% / 13.4%;
with non-blocking sends and no re-run 340B read -2.1..-4.0%). Before: 8.2% / 14.7% with the flash kernel on the GEMM
curve (at 520-830 TFLOP/s), 10.8% / 14.7% also without the MAMF cap. The TP collectives are 12% (175B), 20% (15B)
and 17% (340B) of the predicted time (:func:`planner.fidelity.tp_collective_seconds`).

The thresholds are those figures plus a small margin (regression guards), not goals; nothing is fitted.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.fidelity import load_tables, median, predict_public, public_runs, tp_collective_seconds

ROOT = Path(__file__).resolve().parent.parent
DATA = load_tables(ROOT / "tests" / "data" / "h100_public_runs.json")
GUARD_ROW, GUARD_MEDIAN, GUARD_15B, GUARD_340B = 0.12, 0.025, 0.035, 0.025  # reached 11.2% / 1.5%, 15B 3.0%, 340B 1.7%


def test_rows_reproduce_the_published_throughput():
    """Each row as published: GBS * seq / step time is the published tokens per second (to the step time's
    rounding), the measured iteration time from tokens/s/GPU is the published step time, the published MFU
    follows from the README's model FLOPs per sample at 989 TFLOP/s, and the parallel sizes multiply up."""
    runs = public_runs(DATA)
    assert len(runs) == 18
    assert {r.model for r in runs} == {"gpt3-175b", "nemotron4-15b", "nemotron4-340b"}
    for r in runs:
        tokens = r.batch * r.spec.seq / r.step_time_s
        assert tokens == pytest.approx(r.tokens_per_s, rel=1e-3), r.label
        per_gpu = r.tokens_per_s / r.gpus
        assert r.batch * r.spec.seq / (per_gpu * r.gpus) == pytest.approx(r.step_time_s, rel=1e-3), r.label
        assert r.measured_seconds() == pytest.approx(r.step_time_s, rel=1e-3)
        mfu = r.batch * r.model_flops_per_sample / r.step_time_s / r.gpus / 989e12 * 100
        assert mfu == pytest.approx(r.mfu_percent, abs=0.05), r.label
        assert r.d * r.t * r.p == r.gpus
        assert (r.batch // r.d) % r.micro_batch == 0
    first = runs[0]
    assert (first.model, first.gpus, first.batch, first.step_time_s, first.tokens_per_s) == (
        "gpt3-175b", 128, 256, 8.91, 58843)


def test_rows_the_planner_cannot_express_are_refused():
    data = copy.deepcopy(DATA)
    data["models"]["gpt3-175b"]["rows"][0]["cp"] = 2
    with pytest.raises(ValueError, match="CP/FSDP/EP"):
        public_runs(data)


def test_recipe_options_and_runtime():
    runs = {}
    for r in public_runs(DATA):  # the first (smallest) row of each model
        runs.setdefault(r.model, r)
    o = runs["gpt3-175b"].options()
    assert (o.attention, o.causal, o.dropout, o.sequence_parallel, o.dtype, o.grad_accumulation) == (
        "flash", True, True, True, "bf16", "fused")
    assert runs["nemotron4-340b"].options().recompute == "selective"
    # FlashAttention-2 where the recipe turns cuDNN's attention off (NVTE_FUSED_ATTN=0), cuDNN's where
    # Transformer Engine picks it on Hopper
    assert [runs[m].options().attention_impl for m in ("gpt3-175b", "nemotron4-15b", "nemotron4-340b")] == [
        "flash2", "cudnn", "cudnn"]
    # the recipe's TP overlap is recorded, not modelled: the runtime is the same with and without it
    assert runs["gpt3-175b"].recipe["tp_comm_overlap"] and not runs["nemotron4-340b"].recipe["tp_comm_overlap"]
    assert runs["gpt3-175b"].environment() == runs["nemotron4-15b"].environment() == {"dp_allreduce": "overlapped"}
    # 340B batches its sends without overlapping them: Megatron-Core waits on them and synchronizes the device
    assert runs["nemotron4-340b"].recipe["batch_p2p_comm"] and not runs["nemotron4-340b"].recipe["overlap_p2p_comm"]
    assert runs["nemotron4-340b"].environment() == {"dp_allreduce": "overlapped", "p2p": "blocking"}
    assert runs["gpt3-175b"].shards_optimizer()  # distributed optimizer: 4 + 12 / d bytes per parameter


def test_h100_rows_within_the_reached_error():
    base = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100-80gb.json")
    from planner.device import get_device

    dev = get_device("H100-SXM5-80GB")
    runs = public_runs(DATA)
    errs = [predict_public(r, base, dev).iteration_time / r.measured_seconds() - 1 for r in runs]
    assert max(abs(e) for e in errs) <= GUARD_ROW, errs
    assert median([abs(e) for e in errs]) <= GUARD_MEDIAN, errs
    # 15B within 3.5% (its recipe overlaps its TP collectives, not modelled), 340B within 2.5%; 175B predicted
    # fast (module docstring)
    assert all(abs(e) <= GUARD_15B for r, e in zip(runs, errs, strict=True) if r.model == "nemotron4-15b"), errs
    assert all(abs(e) <= GUARD_340B for r, e in zip(runs, errs, strict=True) if r.model == "nemotron4-340b"), errs
    assert all(e < 0 for r, e in zip(runs, errs, strict=True) if r.model == "gpt3-175b"), errs


def test_tp_collective_seconds_is_what_the_passes_charge():
    """The TP collectives' seconds of :func:`tp_collective_seconds` are exactly what the cost model adds to
    each stage's forward and backward beyond the layers' compute (the stage's F and B less the summed shard
    times), per micro-batch, on the device holding the most; on the 340B row (t 8, VP 12) about a sixth of
    the predicted time. (Its recipe's sends are blocking, which the cost model also adds to F and B: they
    are made non-blocking here so that F and B less the layers' compute are the collectives alone.)"""
    from planner.device import get_device

    base = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100-80gb.json")
    run = next(r for r in public_runs(DATA) if r.model == "nemotron4-340b")
    cand = predict_public(run, base, get_device("H100-SXM5-80GB"), environment={"p2p": "overlapped"})
    costs = cand.costs
    assert costs is not None and not costs.config.recompute
    b = costs.base_b
    per_device = []
    for d in range(costs.schedule.devices):
        extra = 0.0
        for _r, s in costs.schedule.stages_on(d):
            work_f = costs._compute(s, "fwd", b)
            work_b = costs._compute(s, "bwd", b)
            extra += (costs.fwd(s) - work_f) + (costs.bwd(s) - work_b)
        per_device.append(extra * cand.microbatches)
    tp = tp_collective_seconds(cand)
    assert tp == pytest.approx(max(per_device), rel=1e-9)
    assert 0.1 < tp / cand.iteration_time < 0.25
