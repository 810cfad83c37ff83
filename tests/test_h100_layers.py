"""The operator model against one layer measured on a real H100 (tests/data/h100_layers_measured.json).

Each H100 public run's layer (its 1/t shard, forward + backward, cuDNN attention, no collectives) ran back to back
for 20 s on a lent H100 SXM5 at its 700 W power limit. Sustained, each took 10-17% longer per iteration than in a
short run: the board holds 700 W by lowering the SM clock from 1980 to ~1400-1500 MHz. The shipped H100 description
states that as ``sustained_rate`` 0.86, taken from a different measurement (a lone 8192^3 GEMM: 670 TFLOP/s
sustained against 780 in a burst; its ``sources``), not from these layers, on top of its GEMM curve measured on the
same H100 (tests/data/h100_gemms_measured.json). The layers are written out in plain torch, so they are predicted
with PyTorch's eager kernels. The model is within 8% of every sustained layer (reached -7.3% on 175B, -0.9% on
15B, -1.7% on 340B with the flash kernel's load balance at few heads per GPU, planner.attention_waves; -8.2 / -1.1 /
-3.1% before it); at the burst
rate it is 13-20% fast against them (and 4-6% fast against the short runs).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.device import get_device
from planner.fidelity import load_tables, public_runs
from planner.operators import gemm_seconds, layer_operators, time_operators

ROOT = Path(__file__).resolve().parent.parent
MEASURED = json.loads((ROOT / "tests" / "data" / "h100_layers_measured.json").read_text())
#: each model's first row, as the device check took it
RUNS = {r.model: r for r in reversed(public_runs(load_tables(ROOT / "tests" / "data" / "h100_public_runs.json")))}
GUARD = 0.08  # reached 7.3% (module docstring)


def _layer_ms(row: dict, dev) -> float:
    run = RUNS[row["model"]]
    assert (run.t, run.micro_batch, run.spec.seq) == (row["t"], row["micro_batch"], row["seq"])
    # the measured layer is written out in plain torch: its norms, activation, dropouts and residual adds run as
    # PyTorch's eager kernels, not the recipe's fused ones
    opts = replace(run.options(), sequence_parallel=False, dtype="bf16", attention_impl=row["attention_impl"],
                   kernels="eager")
    timed = time_operators(layer_operators(run.spec, run.micro_batch, run.t, opts), dev, "bf16")
    return (timed.fwd + timed.bwd) * 1e3


@pytest.mark.parametrize("row", MEASURED["rows"], ids=lambda r: r["model"])
def test_sustained_layer_within_the_reached_error(row):
    dev = get_device("H100-SXM5-80GB")
    assert dev.sustained_rate == pytest.approx(0.86)
    err = _layer_ms(row, dev) / row["sustained_ms"] - 1
    assert abs(err) <= GUARD, f"{row['model']}: predicted {err:+.1%} against the sustained measurement"


def test_the_burst_rate_alone_is_fast_on_every_layer():
    """Without the power limit (sustained_rate 1) every layer is predicted >= 10% fast: the term is needed."""
    burst = get_device("H100-SXM5-80GB").model_copy(update={"sustained_rate": 1.0})
    for row in MEASURED["rows"]:
        assert _layer_ms(row, burst) / row["sustained_ms"] - 1 < -0.10, row["model"]


def test_measurements_show_the_throttle():
    """The data itself: every layer slower sustained than short, by 8-20%."""
    for row in MEASURED["rows"]:
        assert 1.08 <= row["sustained_ms"] / row["short_ms"] <= 1.20, row["model"]


def test_sustained_rate_slows_matrix_kernels_only():
    """``sustained_rate`` divides GEMM (and its MAMF cap) and fused-attention time; element-wise kernels keep
    their memory-bound time; a rate outside (0, 1] is refused, naming the field."""
    from pydantic import ValidationError

    dev = get_device("H100-SXM5-80GB")
    burst = dev.model_copy(update={"sustained_rate": 1.0})
    gemm = (8192, 8192, 8192, 1)
    flops, nbytes = 2.0 * 8192 ** 3, 3 * 2.0 * 8192 ** 2
    t_b, t_s = burst.kernel_time(flops, nbytes, gemm=gemm), dev.kernel_time(flops, nbytes, gemm=gemm)
    assert t_s > t_b * 1.1
    # the tensor-core part and the ceiling are slowed, the operands' streaming and the launch are not
    t_c = flops / (dev.peak("bf16") * dev.gemm_eff(*gemm))
    t_m = nbytes / (dev.memory_bandwidth * dev.mem_eff(nbytes))
    assert dev.processing == "roofline"
    assert t_s == pytest.approx(max(max(t_c / 0.86, t_m) + dev.kernel_overhead_s,
                                    flops / (dev.gemm_ceiling("bf16") * 0.86)), rel=1e-9)
    # a memory-bound GEMM (k = 16) keeps its streaming time: the rate does not reach it
    small = (8192, 8192, 16, 1)
    f2, b2 = 2.0 * 8192 * 8192 * 16, 2.0 * (2 * 8192 * 16 + 8192 * 8192)
    assert dev.kernel_time(f2, b2, gemm=small) == pytest.approx(burst.kernel_time(f2, b2, gemm=small), rel=1e-9)
    a_b = burst.attention_time(1e12, "cudnn", 4096, backward=True, causal=True)
    assert dev.attention_time(1e12, "cudnn", 4096, backward=True, causal=True) == pytest.approx(a_b / 0.86)
    assert dev.kernel_time(0, 1e9) == burst.kernel_time(0, 1e9)
    for bad in (0.0, 1.5):
        with pytest.raises(ValidationError, match="sustained_rate"):
            type(dev).model_validate({**dev.model_dump(), "sustained_rate": bad})


GEMMS = json.loads((ROOT / "tests" / "data" / "h100_gemms_measured.json").read_text())


def _gemm_errors(dev) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in GEMMS["rows"]:
        t = gemm_seconds(dev, r["m"], r["n"], r["k"], r["batch"])
        out.setdefault(r["set"] if r["batch"] == 1 else "batched", []).append(t / r["seconds"] - 1)
    return out


def test_gemm_curve_reproduces_the_measured_h100_gemms():
    """The shipped H100 GEMM description, at its burst rate, against the GEMMs it was measured from (queued on a
    lent H100): the sweep's median within 5% (reached 4.0%), each of the public runs' GEMMs, whole or cut into
    TE's 512- and 4096-row chunks, within 7% (reached 4.9% / 6.1%). The rule it replaced (Calculon's curve scaled to
    the MAMF, no_overlap, wave quantisation) missed the cut GEMMs by 39% (median) and up to 96%;
    the wave rule alone puts 175B's cuts 35-76% slow."""
    import statistics

    dev = get_device("H100-SXM5-80GB")
    assert not dev.wave_quantisation and dev.processing == "roofline"
    errs = _gemm_errors(dev.model_copy(update={"sustained_rate": 1.0}))
    assert statistics.median(abs(e) for e in errs["sweep"]) <= 0.05, errs["sweep"]
    for part in ("public-run whole", "public-run cut"):
        assert max(abs(e) for e in errs[part]) <= 0.07, (part, errs[part])
    # with the wave rule back on, 175B's 512-row cuts (144 tiles of 256 x 128 on 132 SMs) are timed 35-76% slow
    waves = dev.model_copy(update={"sustained_rate": 1.0, "wave_quantisation": True})
    cut = [e for e, r in zip(_gemm_errors(waves)["public-run cut"],
                             [r for r in GEMMS["rows"] if r["set"] == "public-run cut"], strict=True)
           if r["label"].startswith("175b")]
    assert min(cut) > 0.3, cut
