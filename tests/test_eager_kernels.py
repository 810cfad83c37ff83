"""Eager PyTorch kernels (``OperatorOptions.kernels = "eager"``) and torchtitan's selective op checkpointing
(``recompute = "op"``) in the operator model, the profile, the CLI, the API and the exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeplan.cli import app
from planner.analytic import analytic_profile
from planner.device import get_device
from planner.model import PRESETS, ModelSpec
from planner.operators import (
    OperatorOptions,
    eager_rms_norm,
    layer_operators,
    time_operators,
)
from planner.profile import runtime_words

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "dgx-a100-80gb.json"
A100 = get_device("A100-SXM4-80GB")
LLAMA = ModelSpec(name="llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_mlp=True,
                  activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False,
                  vocab=128256, seq=8192)
runner = CliRunner()


def _gemm_flops(ops) -> float:
    return sum(k.flops for op in ops for k in op.fwd + op.bwd_i + op.bwd_w if k.gemm is not None)


def _ops(spec: ModelSpec, **kw):
    return layer_operators(spec, 1, 1, OperatorOptions(attention="flash", dropout=False, causal=True, **kw))


def test_eager_rms_norm_moves_what_torchtitans_ops_move():
    """Per element: forward 28 + 4 el bytes over eight kernels (cast up, pow, mean, + eps, rsqrt, x * r, cast
    down, * weight), backward 76 + 8 el over fourteen; it saves the fp32 input and the cast-down output."""
    rows, width, el = 1000, 4096, 2
    op = eager_rms_norm("n", rows, width, el)
    n = rows * width
    assert len(op.fwd) == 8 and len(op.bwd_i) == 14 and not op.bwd_w
    assert sum(k.nbytes for k in op.fwd) == pytest.approx((28 + 4 * el) * n + 24 * rows)
    assert sum(k.nbytes for k in op.bwd_i) == pytest.approx((76 + 8 * el) * n + 28 * rows + 0)
    assert op.saved_bytes == (4 + el) * n + 4 * rows


def test_eager_llama_layer_splits_the_projections_and_costs_more():
    """Eager: wq, wk, wv and w1, w3 are separate GEMMs with the fused layer's FLOPs (their shared input saved
    once), the grouped-query keys and values are copied to every head, autograd sums the projections' input
    gradients; every memory-bound operator moves more bytes, so the layer takes longer in each pass."""
    fused, eager = _ops(LLAMA), _ops(LLAMA, kernels="eager")
    names = [op.name for op in eager]
    assert {"wq", "wk", "wv", "w1", "w3", "repeat_kv", "qkv_grad_sum", "mlp_grad_sum"} <= set(names)
    assert "qkv" not in names and "mlp_up_gate" not in names
    assert _gemm_flops(eager) == pytest.approx(_gemm_flops(fused))
    by = {op.name: op for op in eager}
    assert by["wq"].saved_bytes > 0 and by["wk"].saved_bytes == by["wv"].saved_bytes == 0
    assert by["w1"].saved_bytes > 0 and by["w3"].saved_bytes == 0
    f, e = time_operators(fused, A100, "bf16"), time_operators(eager, A100, "bf16")
    assert e.fwd > f.fwd and e.bwd_i > f.bwd_i and e.saved_bytes > f.saved_bytes
    assert e.bwd_w == pytest.approx(f.bwd_w, rel=0.05)  # the weight gradients are the same GEMMs, split
    # multi-head attention has no copies to make
    mha = LLAMA.model_copy(update={"kv_heads": 32})
    assert "repeat_kv" not in [op.name for op in _ops(mha, kernels="eager")]


def test_eager_gpt2_keeps_one_qkv_gemm_and_the_layernorm_kernel():
    """A GPT-2 layer in eager PyTorch: c_attn is one GEMM, LayerNorm is one ATen kernel (as fused), the bias
    goes into the GEMM (addmm: no separate bias add); the residual adds and dropouts run apart."""
    spec = PRESETS["gpt2-medium"]
    fused = layer_operators(spec, 2, 1, OperatorOptions())
    eager = layer_operators(spec, 2, 1, OperatorOptions(kernels="eager"))
    by_f, by_e = {op.name: op for op in fused}, {op.name: op for op in eager}
    assert "qkv" in by_e and "wq" not in by_e
    assert [k.name for k in by_e["norm1"].fwd] == [k.name for k in by_f["norm1"].fwd]
    assert len(by_f["qkv"].fwd) == 2 and len(by_e["qkv"].fwd) == 1  # Megatron's separate bias add
    assert [k.name for k in by_e["dropout_add1"].fwd] == ["dropout_add1.dropout", "dropout_add1.add"]


def test_op_checkpointing_saves_every_other_gemm_and_the_attention_kernel():
    """torchtitan's policy on an eager Llama layer: the weight GEMMs in call order are wq, wk, wv, wo, w1,
    w3, w2; the odd ones and the flash kernel keep their outputs, everything else is re-run in the backward's
    I part (never W) and stashes nothing, but the last residual add (nothing needs it); the block keeps its
    input."""
    plain = _ops(LLAMA, kernels="eager")
    op = _ops(LLAMA, kernels="eager", recompute="op")
    by = {o.name: o for o in op}
    kept = {n for n, o in by.items() if not o.recomputed}
    assert kept == {"wq", "wv", "w1", "mlp_down", "flash_attn", "qkv_grad_sum", "mlp_grad_sum", "dropout_add2"}
    assert by["wk"].recomputed and by["proj"].recomputed and by["w3"].recomputed and by["rope"].recomputed
    el, T, h = 2, LLAMA.seq, LLAMA.hidden
    expected = el * T * (LLAMA.heads * LLAMA.d + LLAMA.k * LLAMA.d + LLAMA.f + h)  # wq, wv, w1, w2 outputs
    expected += el * T * LLAMA.heads * LLAMA.d + 4 * LLAMA.heads * T  # the flash output and its LSE
    expected += el * T * h  # the block's input
    assert sum(o.saved_bytes for o in op) == pytest.approx(expected)
    tp, to = time_operators(plain, A100, "bf16"), time_operators(op, A100, "bf16")
    rerun = sum(tp.per_op[o.name][0] for o in op if o.recomputed)
    assert to.rerun == pytest.approx(rerun) and to.bwd_i == pytest.approx(tp.bwd_i + rerun)
    assert to.fwd == pytest.approx(tp.fwd) and to.bwd_w == pytest.approx(tp.bwd_w)
    assert to.recompute == pytest.approx(tp.recompute)  # full recomputation pays the re-run once
    assert to.saved_bytes < tp.saved_bytes / 2


def test_op_checkpointing_counts_torchtitans_gemms_with_fused_kernels_too():
    """torchtitan's model code calls wq, wk, wv and w1, w3 apart (compiled too), so op checkpointing with fused
    kernels counts the same seven GEMMs (saving wq, wv, w1, w2) without the eager kernels' gradient sums."""
    ops = _ops(LLAMA, recompute="op")
    names = [o.name for o in ops]
    assert [n for n in names if n in ("wq", "wk", "wv", "proj", "w1", "w3", "mlp_down")] == [
        "wq", "wk", "wv", "proj", "w1", "w3", "mlp_down"]
    assert "qkv_grad_sum" not in names and "repeat_kv" not in names
    assert {o.name for o in ops if o.mm and not o.recomputed} == {"wq", "wv", "w1", "mlp_down"}
    eager = _ops(LLAMA, kernels="eager", recompute="op")
    assert sum(o.saved_bytes for o in ops) == pytest.approx(sum(o.saved_bytes for o in eager))
    fused_plain = _ops(LLAMA)
    assert _gemm_flops(ops) == pytest.approx(_gemm_flops(fused_plain))


def test_profile_records_kernels_and_op_checkpointing():
    """The analytic profile's environment and notes say what the times assume, and runtime_words names it."""
    base = analytic_profile(LLAMA, A100, micro_batches=(1,), tensor_sizes=(1,),
                            options=OperatorOptions(attention="flash", dropout=False))
    prof = analytic_profile(LLAMA, A100, micro_batches=(1,), tensor_sizes=(1,),
                            options=OperatorOptions(attention="flash", dropout=False, kernels="eager", recompute="op"))
    assert "kernels" not in base.environment and "recompute_granularity" not in base.environment
    assert prof.environment["kernels"] == "eager" and prof.environment["recompute_granularity"] == "op"
    assert "eager PyTorch kernels" in prof.notes and "selective op checkpointing" in prof.notes
    words = " ".join(runtime_words(prof.environment))
    assert "eager PyTorch kernels" in words and "selective op checkpointing" in words
    assert "selective op" not in " ".join(runtime_words(prof.environment, recompute=True))
    block_b, block_e = base.layers[1], prof.layers[1]
    assert block_e.bwd_time[1] > block_b.bwd_time[1] and block_e.fwd_time[1] > block_b.fwd_time[1]


def test_cli_profile_analytic_kernels_and_op(tmp_path):
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--kernels", "eager",
                            "--recompute-granularity", "op", "--out", str(out)])
    assert r.exit_code == 0, r.output
    env = json.loads(out.read_text())["environment"]
    assert env["kernels"] == "eager" and env["recompute_granularity"] == "op"
    r = runner.invoke(app, ["plan", "--profile", str(out), "--cluster", str(CLUSTER), "--global-batch", "64",
                            "--gpus", "8", "--top", "2"])
    assert r.exit_code == 0 and "eager PyTorch kernels" in r.output and "every other GEMM" in r.output, r.output
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--kernels", "compiled",
                            "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "--kernels must be fused or eager" in r.output


def test_exports_say_or_set_the_kernels_and_checkpointing():
    """torchtitan: an op-checkpointed profile exports selective op AC; a fused profile's export says torchtitan
    runs eager ops unless compiled. Megatron-LM: an eager profile's export says Megatron's kernels are fused."""
    from planner.export import export
    from planner.export.common import ExportInput
    from planner.request import Config
    from planner.runspec import RunSpec

    spec = RunSpec(config=Config(tensor=1, pipeline=1, data=8, micro_batch=1, schedule="1f1b"), microbatches=1)
    op = export("torchtitan", ExportInput(spec=spec, recompute_granularity="op", kernels="eager"))
    assert 'mode = "selective"' in op.main.content and 'selective_ac_option = "op"' in op.main.content
    assert not any("unless compiled" in n for n in op.notes)
    fused = export("torchtitan", ExportInput(spec=spec, kernels="fused"))
    assert 'mode = "none"' in fused.main.content and any("unless compiled" in n for n in fused.notes)
    assert not any("unless compiled" in n for n in export("torchtitan", ExportInput(spec=spec)).notes)  # unknown
    tp = RunSpec(config=Config(tensor=2, pipeline=1, data=4, micro_batch=1, schedule="1f1b"), microbatches=1)
    assert any("sequence-parallel" in n for n in export("torchtitan", ExportInput(
        spec=tp, kernels="eager", sequence_parallel=False)).notes)
    assert not any("sequence-parallel" in n for n in export("torchtitan", ExportInput(spec=tp)).notes)  # unknown
    assert not any("sequence-parallel" in n for n in export("torchtitan", ExportInput(
        spec=tp, kernels="eager", sequence_parallel=True)).notes)
    meg = export("megatron", ExportInput(spec=spec, kernels="eager", model=PRESETS["gpt2-medium"]))
    assert any("Megatron-LM runs fused ones" in n for n in meg.notes)
    assert "eager PyTorch kernels" in meg.main.content  # the header's runtime line


def _torchtitan_plan(tmp_path, profile_args: list[str], plan_args: list[str]) -> tuple[Path, Path, list[dict]]:
    """Llama 3.1 8B at sequence 2048 profiled for torchtitan's stack (flash, eager kernels, op checkpointing,
    plus ``profile_args``) and planned on DGX A100s with ``plan_args``: (profile, plan file, candidates)."""
    prof, plan = tmp_path / "p.json", tmp_path / "plan.json"
    r = runner.invoke(app, ["profile-analytic", "--hf-config", str(ROOT / "examples" / "models" / "llama-3.1-8b"),
                            "--seq", "2048", "--device", "a100-80gb", "--attention", "flash", "--kernels", "eager",
                            "--recompute-granularity", "op", *profile_args, "--out", str(prof)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", str(CLUSTER), "--global-batch", "64",
                            *plan_args, "--json"])
    assert r.exit_code == 0, r.output
    plan.write_text(r.output)
    return prof, plan, json.loads(r.output)["candidates"]


def test_export_without_the_profile_reads_the_candidate_document(tmp_path):
    """A plan's candidate says what checkpointing and kernels its times assume, so an export given the plan
    alone (no --profile) still writes torchtitan's op checkpointing and the eager header, not "none"."""
    prof, plan, cands = _torchtitan_plan(tmp_path, [], ["--gpus", "64", "--shard-parameters", "--top", "2"])
    doc = cands[0]
    assert (doc["kernels"], doc["recompute_granularity"]) == ("eager", "op") and not doc["recompute"]
    r = runner.invoke(app, ["export", "--plan", str(plan), "--candidate", "0", "--format", "torchtitan"])
    assert r.exit_code == 0, r.output
    assert 'selective_ac_option = "op"' in r.output and "eager PyTorch kernels" in r.output
    assert "unless compiled" not in r.output
    r = runner.invoke(app, ["predict", "--profile", str(prof), "--cluster", str(CLUSTER), "--global-batch", "64",
                            "--tensor", "1", "--pipeline", "1", "--data", "64", "--micro-batch", "1", "--schedule",
                            "1f1b", "--shard-parameters"])
    assert r.exit_code == 0 and "the profile's times assume" in r.output and "every other GEMM" in r.output, r.output


def test_export_without_the_profile_knows_sequence_parallelism_from_the_candidate(tmp_path):
    """A --sequence-parallel profile's t > 1 candidate exported from the plan alone: the candidate document says
    its times assume sequence parallelism, so torchtitan's export does not tell the user to profile with it;
    a plan without the profile or the cluster also says where the Megatron launch line puts the processes."""
    _, plan, cands = _torchtitan_plan(tmp_path, ["--sequence-parallel"],
                                      ["--gpus", "16", "--schedules", "1f1b", "--top", "20"])
    k = next(i for i, c in enumerate(cands) if c["tensor"] > 1)
    assert cands[k]["sequence_parallel"] is True
    assert all(c["sequence_parallel"] is False for c in cands if c["tensor"] == 1)
    r = runner.invoke(app, ["export", "--plan", str(plan), "--candidate", str(k), "--format", "torchtitan"])
    assert r.exit_code == 0 and "sequence-parallel" not in r.output and "sequence parallelism" in r.output, r.output
    r = runner.invoke(app, ["export", "--plan", str(plan), "--candidate", str(k), "--format", "megatron"])
    assert r.exit_code == 0 and "no GPUs per node known" in r.output, r.output
