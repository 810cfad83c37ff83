"""The operator model against one layer measured on a real H100 (tests/data/h100_layers_measured.json).

Each H100 public run's layer (its 1/t shard, forward + backward, cuDNN attention, no collectives) ran back to back
for 20 s on a lent H100 SXM5 at its 700 W power limit. Sustained, each took 10-17% longer per iteration than in a
short run: the board holds 700 W by lowering the SM clock from 1980 to ~1400-1500 MHz. The shipped H100 description
states that as ``sustained_rate`` 0.86, taken from a different measurement (a lone 8192^3 GEMM: 670 TFLOP/s
sustained against 780 in a burst; its ``sources``), not from these layers. With it the model is within 6% of every
sustained layer (reached -5.8% on 175B, -1.6% on 15B, -1.8% on 340B); at the burst rate it was 15-17% fast.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.device import get_device
from planner.fidelity import load_tables, public_runs
from planner.operators import layer_operators, time_operators

ROOT = Path(__file__).resolve().parent.parent
MEASURED = json.loads((ROOT / "tests" / "data" / "h100_layers_measured.json").read_text())
GUARD = 0.06  # reached 5.8% (module docstring)


def _layer_ms(row: dict, dev) -> float:
    runs = {r.model: r for r in reversed(public_runs(load_tables(ROOT / "tests" / "data" / "h100_public_runs.json")))}
    run = runs[row["model"]]  # the model's first row, as the device check took it
    assert (run.t, run.micro_batch, run.spec.seq) == (row["t"], row["micro_batch"], row["seq"])
    opts = replace(run.options(), sequence_parallel=False, dtype="bf16", attention_impl=row["attention_impl"])
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
    # the tensor-core part and the MAMF cap are slowed, the operands' streaming and the launch are not
    t_c = flops / (dev.peak("bf16") * dev.gemm_eff(*gemm))
    t_m = nbytes / (dev.memory_bandwidth * dev.mem_eff(nbytes))
    assert t_s == pytest.approx(max(t_c / 0.86 + t_m + dev.kernel_overhead_s,
                                    flops / (dev.gemm_ceiling("bf16") * 0.86)), rel=1e-9)
    a_b = burst.attention_time(1e12, "cudnn", 4096, backward=True, causal=True)
    assert dev.attention_time(1e12, "cudnn", 4096, backward=True, causal=True) == pytest.approx(a_b / 0.86)
    assert dev.kernel_time(0, 1e9) == burst.kernel_time(0, 1e9)
    for bad in (0.0, 1.5):
        with pytest.raises(ValidationError, match="sustained_rate"):
            type(dev).model_validate({**dev.model_dump(), "sustained_rate": bad})
