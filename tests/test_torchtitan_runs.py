"""torchtitan's published FSDP2 runs (tests/data/torchtitan_runs.json, :mod:`planner.fidelity_torchtitan`): the
rows as data (their MFU follows from their throughput) and the eager-kernel predictions as regression guards
(the figures reached, ``python benchmarks/torchtitan_bench.py``, plus a margin; not goals: nothing is fitted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.fidelity_torchtitan import h100_memory, predict_row, torchtitan_runs

ROOT = Path(__file__).resolve().parent.parent
RUNS = torchtitan_runs(json.loads((ROOT / "tests" / "data" / "torchtitan_runs.json").read_text()))


def test_torchtitan_rows_reproduce_the_published_mfu():
    """Each published row's MFU follows from its WPS with torchtitan's count (6 N + 12 l h s per token, N
    with the embedding) at 312 TFLOP/s: the shapes are the runs' own."""
    runs = RUNS
    assert len(runs) == 8
    for r in runs:
        assert r.wps * r.model_flops_per_token() / 312e12 * 100 == pytest.approx(r.mfu_percent, abs=0.06), r.label


#: reached 15.6% / 11.9% (benchmarks/torchtitan_bench.py; 22.2% / 15.1% before FSDP's overlapped collectives were
#: charged what their channels take from the compute: planner.contention); not goals
GUARD_ROW, GUARD_MEDIAN = 0.17, 0.13


def test_torchtitan_rows_regression_guard():
    """Eager kernels on every row: slower than the fused kernels' prediction (they move more bytes), within the
    guards of the figures reached; the measured order of the checkpointing policies of Llama 3 8B (op faster
    than every-second-layer) and of Llama 2 13B (none fastest) holds."""
    runs = RUNS
    errors, pred = [], {}
    for r in runs:
        e, f = predict_row(r, "eager"), predict_row(r, "fused")
        assert e.seconds > f.seconds, r.label
        errors.append(abs(e.seconds / r.measured_seconds() - 1))
        pred[r.label] = e.seconds
    errors.sort()
    assert max(errors) <= GUARD_ROW and errors[len(errors) // 2] <= GUARD_MEDIAN, errors
    assert pred["llama3-8b b=1 selective op"] < pred["llama3-8b b=1 selective layer"]
    assert pred["llama2-13b b=2 none"] < min(pred["llama2-13b b=2 selective op"],
                                            pred["llama2-13b b=2 selective layer"])


def test_the_stated_out_of_memory_configuration_does_not_fit():
    """torchtitan's footnote: Llama 2 70B at local batch 2 with op checkpointing ran out of memory, so the table
    gives local batch 1; the eager prediction puts the first over 80 GiB and the second under it."""
    data = json.loads((ROOT / "tests" / "data" / "torchtitan_runs.json").read_text())
    (oom,) = torchtitan_runs(data, "out_of_memory")
    assert predict_row(oom, "eager").memory_gib > 80
    ran = next(r for r in RUNS if (r.model, r.ac) == (oom.model, oom.ac))
    assert ran.local_batch == 1 and predict_row(ran, "eager").memory_gib < 80


def test_h100_memory_is_under_the_reserved_peak_and_scales_with_the_shards():
    """torchtitan's H100 FSDP rows of Llama 3.1 8B (8 and 128 GPUs) logged the allocator's maximum reserved,
    which is at or above what tensors hold: the prediction (state, stash, the loss's fp32 logits and gradients,
    reserve) is under it by less than the allocator's usual slack, and the two rows differ by the sharded
    state (16 bytes per parameter over 8 against over 128). Without the loss's transient both were ~20 GiB
    under."""
    data = json.loads((ROOT / "tests" / "data" / "torchtitan_runs.json").read_text())
    rows = {r["gpus"]: r["memory_gib"] for r in data["h100_fsdp_memory"]["rows"]}
    pred = {g: h100_memory(g) for g in rows}
    for g, measured in rows.items():
        assert measured - 8 < pred[g] <= measured, (g, pred[g], measured)
    assert (pred[8] - pred[128]) == pytest.approx(rows[8] - rows[128], abs=2.0)
