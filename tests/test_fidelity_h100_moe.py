"""Predicted against measured on H100 for a mixture of experts: NVIDIA's published GPT OSS 120B BF16 rows on DGX-H100
(tests/data/h100_moe_public_runs.json; NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md @ 0a25f911,
the 25.11 and 26.02 NeMo containers): 64 GPUs, TP 1, PP 4, EP 8, GBS 512 / MBS 4 (5630 tokens/s/GPU, 5.820 s) and
GBS 1280 / MBS 1 (5993 tokens/s/GPU, 13.670 s).

Predicted (``python benchmarks/fidelity_h100_bench.py --moe-only``) in the stated configuration with the shipped H100
description and DGX H100 cluster: 3.71 s (-36%) and 7.59 s (-45%). The model is fast on both rows, by about the same
time per micro-batch: at MBS 1 (what every stored H100 config of the recipe sets, and what makes the 25.11 row's GA
consistent) the two rows' measured time per 1F1B slot is 166 ms and 165 ms, the predicted slot (the last stage's
forward and backward, 9 MoE layers and the 201,088-word output layer) 90 ms. No modelled term is large enough to
close it (the bench's "gap per term": the all-to-alls are 7-9% of the prediction, the attention window 2-4%, one GEMM
per expert instead of the grouped GEMM 3-9%, the held clock up to 10%); what the model leaves out is named in the
bench's docstring.

The bound asserted is the one the physics gives without tuning: the prediction is below the measured time. The
model times every kernel at rates measured or published for the H100 and leaves out only terms that add time (the
host's launches between the dispatcher's synchronisations, the random router's imbalance, the recipe's
recomputation of the norms and the experts' activation); the one term it charges beyond what the recipe runs, the
cross-entropy as separate fp32 passes instead of Transformer Engine's fused kernel, is estimated and taken off too.
And it is above the floor of the published model FLOPs at the H100's peak. The errors themselves are reported
(``record_property``), not bounded: a bound tuned to two rows would say nothing about the rows we are not shown.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.device import get_device
from planner.fidelity import load_tables
from planner.fidelity_moe import (
    alltoall_seconds,
    fused_loss_seconds,
    moe_public_runs,
    predict_moe,
    recompute_seconds,
    slot_seconds,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = load_tables(ROOT / "tests" / "data" / "h100_moe_public_runs.json")


@pytest.fixture(scope="module")
def predicted():
    base = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100-80gb.json")
    dev = get_device("H100-SXM5-80GB")
    return base, dev, [(run, predict_moe(run, base, dev)) for run in moe_public_runs(DATA)]


def test_rows_are_as_published():
    """The two rows exactly as the archive prints them, their iteration times from tokens/s/GPU, and the same model
    FLOPs per token in both releases to the TFLOP/s column's rounding."""
    runs = moe_public_runs(DATA)
    assert [(r.release, r.gpus, r.batch, r.micro_batch, r.t, r.p, r.chunks, r.expert, r.tokens_per_gpu,
             r.tflops_per_gpu) for r in runs] == [("25.11", 64, 512, 4, 1, 4, 1, 8, 5630, 153),
                                                  ("26.02", 64, 1280, 1, 1, 4, 1, 8, 5993, 163)]
    rows = DATA["models"]["gpt-oss-120b"]["rows"]
    assert rows[0]["ga"] == 2 and "ga" not in rows[1] and rows[1]["vp"] == "n/a"
    assert [r.measured_seconds() for r in runs] == pytest.approx([5.820, 13.670], abs=1e-3)
    assert all(r.spec.seq == 4096 and r.d == 16 for r in runs)
    a, b = (r.model_flops_per_token() for r in runs)
    assert a == pytest.approx(b, rel=0.5 / 153)
    assert DATA["source"]["repo"] == "NVIDIA-NeMo/Megatron-Bridge"
    assert DATA["source"]["path"] == "docs/performance-summary-archive.md"


def test_model_is_gpt_oss_120b():
    spec = moe_public_runs(DATA)[0].spec
    assert spec.total_params() == DATA["models"]["gpt-oss-120b"]["total_params"] == 116_829_156_672
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.experts, spec.experts_per_token) == (
        36, 2880, 64, 8, 128, 4)
    assert spec.attention_sinks and spec.sliding_window == 128 and spec.global_every == 2


def test_ga_column_is_not_the_pipelines_micro_batches():
    """The 25.11 row's printed GA 2 is GBS / (MBS GPUs), the pipeline left out; at its TP 1, PP 4 each pipeline runs
    GBS / (MBS d) = 8 micro-batches (tests/data/h100_moe_public_runs.json, columns_note)."""
    run = moe_public_runs(DATA)[0]
    ga = DATA["models"]["gpt-oss-120b"]["rows"][0]["ga"]
    assert ga == run.batch // (run.micro_batch * run.gpus) != run.microbatches() == 8


def test_mbs_one_makes_the_rows_agree_per_slot():
    """At MBS 1 (the recipe's H100 configs) the measured time per 1F1B slot (the iteration over m + p - 1) is the
    same in both rows to 1.5%; at the 25.11 row's printed MBS 4 its slot would hold four sequences in 529 ms."""
    old, new = moe_public_runs(DATA)
    per_slot = [r.measured_seconds() / (r.microbatches(1) + r.p - 1) for r in (old, new)]
    assert per_slot[0] == pytest.approx(per_slot[1], rel=0.015)


def test_recipe_options_and_runtime():
    run = moe_public_runs(DATA)[0]
    o = run.options()
    assert (o.attention, o.attention_impl, o.causal, o.dropout, o.sequence_parallel, o.dtype, o.grad_accumulation,
            o.recompute, o.expert_gemm) == ("flash", "cudnn", True, False, False, "bf16", "fused", "none", "grouped")
    assert run.environment() == {"dp_allreduce": "overlapped", "p2p": "blocking"}
    assert run.shards_optimizer()
    r = run.recipe
    assert (r["token_dispatcher"], r["recompute_modules"], r["cuda_graphs"], r["tp_comm_overlap"]) == (
        "alltoall", ["layernorm", "moe_act"], False, False)


def test_rows_the_planner_cannot_express_are_refused():
    data = copy.deepcopy(DATA)
    data["models"]["gpt-oss-120b"]["rows"][0]["cp"] = 2
    with pytest.raises(ValueError, match="CP/FSDP"):
        moe_public_runs(data)


def test_stated_configuration_is_predicted(predicted):
    """Each row as stated: t 1, p 4, d 16, e 8, 1F1B, Megatron's even split (the embedding with the first 9 layers,
    the output layer with the last 9), the pipeline outermost (each EP group of 8 one node)."""
    _base, _dev, rows = predicted
    for run, cand in rows:
        c = cand.config
        assert (c.tensor, c.pipeline, c.data, c.expert, c.micro_batch, c.schedule, c.order) == (
            1, 4, 16, 8, run.micro_batch, "1f1b", "tp-dp-pp")
        assert cand.partition == [[0, 10], [10, 19], [19, 28], [28, 38]]
        assert cand.microbatches == run.microbatches()


def test_errors_are_reported_and_within_what_the_physics_bounds(predicted, record_property):
    """Each row's error is reported; the prediction is below the measured time, also with the fused cross-entropy's
    estimate taken off (module docstring), and above the floor of the published model FLOPs at the H100's peak."""
    _base, dev, rows = predicted
    for run, cand in rows:
        meas = run.measured_seconds()
        err = cand.iteration_time / meas - 1
        record_property(f"error {run.label}", f"{err:+.3f}")
        print(f"{run.label}: measured {meas:.3f} s, predicted {cand.iteration_time:.3f} s ({err:+.1%}), "
              f"all-to-alls {alltoall_seconds(cand):.3f} s, slot {slot_seconds(cand) * 1e3:.1f} ms, "
              f"memory {max(cand.memory) / 2**30:.1f} GiB")
        assert cand.iteration_time < meas
        assert cand.iteration_time + fused_loss_seconds(run, dev) < meas
        floor = run.batch * run.spec.seq * run.model_flops_per_token() / (run.gpus * dev.peak("bf16"))
        assert cand.iteration_time > floor


def test_terms_reported(predicted):
    """The all-to-alls are a part of the prediction; the recomputation estimate adds time, the fused loss takes it
    off; the 26.02 row (MBS 1) fits the memory model in 80 GiB, as it ran."""
    base, dev, rows = predicted
    for run, cand in rows:
        a2a = alltoall_seconds(cand)
        assert 0 < a2a < 0.2 * cand.iteration_time
        assert a2a == pytest.approx(cand.breakdown["alltoall_in_compute"], rel=1e-9)
        assert recompute_seconds(run, dev) > 0 > fused_loss_seconds(run, dev)
    run, cand = rows[1]
    assert run.micro_batch == 1 and max(cand.memory) < base.memory_bytes
