"""benchmarks/device_check.py, issue 11's one-call GPU check, run here in its --quick CPU mode (seconds)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "device_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("device_check", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``--quick`` CPU run of every phase (~25 s on the 2-core machine), read by the tests below."""
    out = tmp_path_factory.mktemp("device-check") / "out"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--quick", "--device", "cpu",
                        "--sustain-s", "0.2"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_quick_cpu_run_writes_the_predicted_vs_measured_table(quick_cpu_run: Path) -> None:
    out = quick_cpu_run
    for name in ("machine.json", "device.json", "gpt2-medium-fp32.json", "layer_check.json", "summary.txt",
                 "sustained_gemm.json"):
        assert (out / name).is_file(), name
    assert len(list(out.iterdir())) <= 7  # the device tool returns at most 8 files from $OUT (log.txt is one)

    machine = json.loads((out / "machine.json").read_text())
    assert [p["phase"] for p in machine["phases"]] == ["machine", "device", "profile", "check", "chunks", "layers",
                                                        "eager", "fp8", "contention", "queued", "dispatch",
                                                        "attention", "sustained_layer", "duty_cycle",
                                                        "sustained"]
    # the contention stand-in is two Triton kernels on a second CUDA stream: skipped on the CPU, saying why
    assert all(p["status"] == "done" for p in machine["phases"] if p["phase"] != "contention")
    (cont,) = [p for p in machine["phases"] if p["phase"] == "contention"]
    assert cont["status"] == "skipped" and "CUDA" in cont["why"]
    # the public runs' GEMMs whole and in Transformer Engine's overlap chunks: one row per (GEMM, cut), the cut
    # one as many rows fewer as it has chunks, every time measured and predicted
    chunks = machine["chunks"]
    assert len(chunks) == 16 and {r["chunks"] for r in chunks} == {1, 4}
    for whole, cut in zip(chunks[::2], chunks[1::2], strict=True):
        assert whole["label"] == cut["label"] and whole["m"] == cut["m"] * cut["chunks"]
        assert whole["meas_s"] > 0 and cut["pred_s"] > 0 and math.isfinite(cut["err"])

    # torchtitan's eager Llama block (plain and op-checkpointed) and its RMSNorm and SwiGLU, each measured and
    # predicted with eager kernels
    eager = machine["eager"]
    assert [r["label"] for r in eager] == ["layer", "layer, op checkpointing", "RMSNorm", "SwiGLU"]
    for r in eager:
        assert "error" not in r, r
        assert r["meas_fwd_bwd_s"] > r["meas_fwd_s"] > 0 and math.isfinite(r["fwd_bwd_err"]), r
    assert eager[1]["pred_fwd_bwd_s"] > eager[0]["pred_fwd_bwd_s"]  # the re-run
    assert "EAGER LAYER" in (out / "summary.txt").read_text()

    # FP8 against bf16 on the published FP8 runs' GEMMs (shrunk on the CPU): every rate measured
    fp8 = machine["fp8"]
    assert [r["label"] for r in fp8] == ["70b qkv", "70b proj", "70b fc1", "70b fc2", "175b fc1"]
    assert all(r[f"{k}_tflops"] > 0 and math.isfinite(r["speedup"]) for r in fp8 for k in ("bf16", "fp8", "fp8_cast"))
    assert "FP8 vs BF16 GEMMs" in (out / "summary.txt").read_text()

    check = json.loads((out / "layer_check.json").read_text())
    assert set(check["descriptions"]) == {"shipped", "measured_desc"}
    assert check["options"]["attention"].startswith("unfused")  # the zoo writes its attention out
    kinds = {(r["kind"], r["t"]) for r in check["rows"]}
    assert kinds == {("embedding", 1), ("transformer", 1), ("transformer", 2), ("lm_head", 1)}
    for row in check["rows"]:
        for key, value in row.items():
            if key not in ("kind", "t", "b"):
                assert math.isfinite(value) and (key.endswith("_err") or value > 0), (key, value)
    assert all(math.isfinite(v) for v in check["median_abs_error"].values())

    summary = (out / "summary.txt").read_text()
    assert "PREDICTED vs MEASURED" in summary and "SUSTAINED vs BURST" in summary and "GEMMs WHOLE and CUT" in summary
    lines = summary.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("layer") and "meas fwd ms" in line)
    assert "shipped fwd" in lines[head] and "measured_desc bwd" in lines[head]
    rows = lines[head + 2:head + 2 + len(check["rows"])]
    assert [line.split()[0] for line in rows] == [r["kind"] for r in check["rows"]]
    for line in rows:
        numbers = [float(x.rstrip("%")) for x in re.findall(r"[-+]?\d+\.\d+%?", line)]
        assert len(numbers) == 2 + 4 * 2 and all(math.isfinite(x) for x in numbers), line
    assert lines[head + 2 + len(check["rows"])].startswith("median |error|")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_shell_entry_skips_what_the_budget_does_not_allow(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh"), "run", str(out), "--quick",
                        "--device", "cpu", "--budget-s", "0", "--sustain-s", "0.2"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    phases = {p["phase"]: p["status"] for p in json.loads((out / "machine.json").read_text())["phases"]}
    assert phases == {"machine": "done", "device": "skipped", "profile": "skipped", "check": "skipped",
                      "chunks": "skipped", "layers": "skipped", "eager": "skipped", "fp8": "skipped",
                      "contention": "skipped", "queued": "skipped", "dispatch": "skipped",
                      "attention": "skipped", "sustained_layer": "skipped", "duty_cycle": "skipped",
                      "sustained": "done"}
    assert "phase device: skipped" in (out / "log.txt").read_text()
    assert "SUSTAINED vs BURST" in (out / "summary.txt").read_text()


def test_sustained_rates_per_second_and_windows() -> None:
    dc = _load()
    flops = 1e12
    # 30 s of 0.1 s chunks of one 1-TFLOP GEMM: 10 TFLOP/s for 15 s, then 8 TFLOP/s (a throttled GPU)
    chunks = [(0.1, 1)] * 150 + [(0.125, 1)] * 120
    s = dc.summarise_chunks(chunks, flops)
    assert s["gemms"] == 270 and s["run_s"] == pytest.approx(30.0)
    assert s["burst_first_1s_tflops"] == pytest.approx(10.0)
    assert s["first_window_tflops"] == pytest.approx(10.0) and s["last_window_tflops"] == pytest.approx(8.0)
    assert s["last_over_first"] == pytest.approx(0.8)
    assert [round(p["tflops"], 6) for p in s["per_second"]][:15] == [10.0] * 15
    assert s["per_second"][-1]["tflops"] == pytest.approx(8.0)


FAKE_SMI = r"""#!/usr/bin/env bash
# a fake nvidia-smi: knows the new clock-event field, not the old throttle one nor power.draw
case "$1" in
  --query-gpu=*)
    fields=${1#--query-gpu=}
    case "$fields" in *power.draw*|*clocks_throttle_reasons*) echo "Field is not a valid field to query."; exit 2;; esac
    out=""
    IFS=, read -ra names <<< "$fields"
    for n in "${names[@]}"; do
      case "$n" in
        timestamp) v="2026/11/27 03:02:11.123";; clocks.sm) v=1980;; clocks.mem) v=2619;;
        temperature.gpu) v=51;; clocks_event_reasons.active) v=0x0000000000000004;; *) v=0;;
      esac
      out="${out:+$out, }$v"
    done
    echo "$out";;
  *) echo "fake nvidia-smi -q";;
esac
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_smi_sampler_keeps_the_fields_the_driver_knows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    dc = _load()
    sampler = dc.SmiSampler(period=0.2)
    assert sampler.available
    assert sampler.fields == ["timestamp", "clocks.sm", "clocks.mem", "temperature.gpu", "clocks_event_reasons.active"]
    sampler.start()
    import time

    time.sleep(0.7)
    samples = sampler.stop()
    assert len(samples) >= 2 and samples[0]["clocks.sm"] == "1980"
    summary = dc.smi_summary(samples[:1], samples[1:])
    assert summary["busy_clocks.sm"]["median"] == 1980 and summary["busy_power.draw"] is None
    assert summary["busy_clock_event_reasons"] == ["0x0000000000000004"]


def test_public_layer_specs_and_shards() -> None:
    """The layers the GPU check times are the H100 public runs' (t, b, seq, kernels; sequence parallelism off: one
    GPU runs no collectives), and the torch shard holds the 1/t share of a layer's weights the operator model
    counts, with GQA, squared ReLU and biases as the recipes have them; it runs forward and backward."""
    import argparse

    import torch

    dc = _load()
    args = argparse.Namespace(quick=False, device_type="cuda", dtype="bf16")
    specs = {label: (b, t, spec, opts) for label, spec, b, t, opts in dc.public_layer_specs(args)}
    assert {k: (b, t, spec.seq) for k, (b, t, spec, _o) in specs.items()} == {
        "gpt3-175b": (1, 4, 2048), "nemotron4-15b": (4, 4, 4096), "nemotron4-340b": (1, 8, 4096)}
    assert all(not o.sequence_parallel and o.attention == "flash" for _b, _t, _s, o in specs.values())
    assert specs["gpt3-175b"][3].dropout and not specs["nemotron4-15b"][3].dropout
    for label, (_b, t, spec, opts) in specs.items():  # each shrunk 16x, 2 query heads per rank, GQA kept
        small = spec.with_(hidden=spec.hidden // 16, heads=2 * t, kv_heads=t if spec.k < spec.heads else 2 * t,
                           seq=64, head_dim=None, ffn_hidden=spec.f // 16)
        forward, x, params = dc.layer_shard(small, 1, t, opts.dropout, torch.device("cpu"), torch.float32)
        from torch.nn.attention import SDPBackend

        y = forward(x, SDPBackend.MATH)
        assert y.shape == x.shape, label
        y.sum().backward()
        assert all(p.grad is not None for p in params) and x.grad is not None, label
        norms = 4 * small.hidden if small.norm == "layernorm" else 2 * small.hidden
        got = sum(p.numel() for p in params) - norms
        assert got == pytest.approx((small.layer_params() - norms) / t, rel=0.02), label


def test_quick_layers_phase_rows(quick_cpu_run: Path) -> None:
    """The layers phase's CPU stand-in row: measured and predicted forward and backward, finite."""
    out = quick_cpu_run
    rows = json.loads((out / "machine.json").read_text())["public_layers"]
    assert [(x["label"], x["attention"]) for x in rows] == [("stand-in", "math")]
    assert all(math.isfinite(rows[0][k]) and rows[0][k] > 0 for k in ("meas_fwd_s", "meas_bwd_s", "pred_fwd_s",
                                                                       "pred_bwd_s"))
    assert rows[0]["kernels"] and set(rows[0]["pred_per_op_ms"]) >= {"qkv", "flash_attn", "mlp_up", "mlp_down"}
    assert "PUBLIC-RUN LAYERS" in (out / "summary.txt").read_text()


def test_contention_rows_and_their_table(tmp_path: Path) -> None:
    """The contention phase's rows (GPU only, so built here from given times): each op beside the stand-in over
    alone, and the model's 1 / (1 - 24 / SMs); the summary prints them and says when a stand-in ended first."""
    dc = _load()
    assert [op[0] for op in dc.contention_ops()] == ["qkv", "fc1", "fc2", "add"]
    times = {("qkv", "alone"): 1.0e-3, ("qkv", "spin"): 1.2e-3, ("qkv", "copy"): 1.3e-3,
             ("add", "alone"): 2.0e-4, ("add", "spin"): 2.0e-4, ("add", "copy"): 3.0e-4}
    rows = dc.contention_rows(times, 132)
    assert [r["label"] for r in rows] == ["qkv", "add"]
    assert rows[0]["spin_ratio"] == pytest.approx(1.2) and rows[0]["copy_ratio"] == pytest.approx(1.3)
    assert rows[0]["predicted_ratio"] == pytest.approx(1 / (1 - 24 / 132))
    assert dc.contention_rows(times, None)[0]["predicted_ratio"] is None
    run = dc.Run(out=tmp_path, budget_s=1.0)
    rows[1]["stand_in_ended_first"] = ["copy"]
    run.contention = rows
    text = dc.summary_text(run)
    assert "CONTENTION: each op beside 24 blocks of 512 threads" in text
    assert "1.200" in text and "1.222" in text and "(the stand-in ended first: copy)" in text
