"""The load balance of a flash attention kernel's grid (planner.attention_waves) and what it does to the kernel
times, against attention kernels measured on a lent H100 (tests/data/h100_attention_measured.json)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from planner.attention_waves import balance
from planner.device import get_device

DATA = Path(__file__).parent / "data" / "h100_attention_measured.json"


def test_unmasked_kernel_loses_only_its_last_wave():
    """Equal blocks: wave quantisation (one more block than the SMs takes two waves for 1 + 1/S of work)."""
    assert balance(132, 128, 128, 132, causal=False, backward=False) == 1.0
    assert balance(133, 128, 128, 132, causal=False, backward=True) == pytest.approx(133 / 264)
    assert balance(4, 4096, 128, 132, causal=False, backward=False) == pytest.approx(128 / 132)


def test_causal_kernel_balances_with_many_blocks_per_sm_and_not_with_few():
    """The triangle's unequal blocks: 16k tokens of 16 heads (the papers' shape) fill the SMs to within ~8%;
    one sequence of 24 heads at 2k (GPT-3 175B at t = 4) leaves about a third of the SM time idle; more
    heads never balance worse by more than the rounding of the last wave."""
    papers = balance(128, 2048, 128, 132, causal=True, backward=False)
    few = balance(24, 2048, 128, 132, causal=True, backward=False)
    assert papers > 0.9 and few < 0.75
    for bw in (False, True):
        fills = [balance(h, 4096, 128, 132, causal=True, backward=bw) for h in (1, 4, 12, 48, 192, 768)]
        assert fills == sorted(fills) and fills[-1] > 0.95
    # one head of a long sequence: the longest block alone is 1/n of all its work spread over n blocks
    assert balance(1, 1024, 128, 132, causal=True, backward=False) == pytest.approx(36 / (132 * 8))


def test_bad_shape_is_refused():
    with pytest.raises(ValueError, match="heads, seq, block and sms"):
        balance(0, 2048, 128, 132, causal=True, backward=False)


def measured() -> list[dict]:
    return json.loads(DATA.read_text())["rows"]


def rate_ratios(rows: list[dict]) -> list[tuple[str, str, str, float]]:
    """(label, impl, fwd|bwd, rate at the run's shape / rate at the papers' shape at the same sequence) from
    measured rows: how much slower the same kernel ran on fewer heads."""
    flops = {True: 2.5, False: 1.0}
    paper = {(r["impl"], r["seq"]): r for r in rows if r["label"].startswith("fa3 paper")}
    out = []
    for r in rows:
        if r["label"].startswith("fa3 paper"):
            continue
        p = paper[(r["impl"], r["seq"])]
        for bw, key in ((False, "fwd_s"), (True, "bwd_s")):
            work = r["b"] * r["heads"] * r["d"] * flops[bw]
            work_p = p["b"] * p["heads"] * p["d"] * flops[bw]
            out.append((r["label"], r["impl"], "bwd" if bw else "fwd", (work / r[key]) / (work_p / p[key])))
    return out


def test_few_heads_per_gpu_ran_slower_on_an_h100_as_the_balance_rule_says():
    """The public runs' per-GPU attention shapes against the papers' shape on the lent H100, same kernel and
    sequence length: the measured rate ratios (0.63-0.82 with 12-24 heads of one sequence, 0.96-1.01 with
    48) against the shipped description's (the balance of the two grids; nothing fitted): every ratio within
    21% (cuDNN's GQA backward at 340B, 12 query heads on one key/value head, ran slowest) and the median
    within 5%, where the papers' rate at every shape (the rule before) is 18-37% fast on the few-heads rows."""
    h100 = get_device("H100-SXM5-80GB").model_copy(update={"sustained_rate": 1.0})
    rows = measured()
    errors, before = [], []
    for label, impl, kind, meas in rate_ratios(rows):
        r = next(x for x in rows if x["label"] == label and x["impl"] == impl)
        bw = kind == "bwd"
        ref_heads = h100.attention_efficiency[impl].reference_heads_at(r["seq"])
        t = [h100.attention_time(1e12, impl, r["seq"], backward=bw, causal=True, heads=h) for h in
             (r["b"] * r["heads"], ref_heads)]
        pred = t[1] / t[0]
        errors.append(meas / pred - 1)  # predicted time / measured time - 1 (negative: predicted fast)
        before.append(meas - 1)
    assert len(errors) == 12
    assert max(abs(e) for e in errors) < 0.21, errors
    assert statistics.median(abs(e) for e in errors) < 0.05, errors
    few = [b for b, (label, *_rest) in zip(before, rate_ratios(rows), strict=True) if label != "nemotron4-15b"]
    assert all(b < -0.15 for b in few), few


def test_the_kernel_time_follows_the_balance_and_only_with_heads_and_sms():
    """``attention_time`` scales the papers' efficiency by balance(shape) / balance(papers' shape); without
    ``heads`` (or on a device without ``sm_count``) it is the papers' rate as before."""
    h100 = get_device("H100-SXM5-80GB")
    plain = h100.attention_time(1e12, "cudnn", 2048, backward=True, causal=True)
    at_papers = h100.attention_time(1e12, "cudnn", 2048, backward=True, causal=True, heads=128)
    few = h100.attention_time(1e12, "cudnn", 2048, backward=True, causal=True, heads=24)
    assert at_papers == pytest.approx(plain)
    ratio = balance(128, 2048, 128, 132, causal=True, backward=True) / balance(24, 2048, 128, 132, causal=True,
                                                                                backward=True)
    assert few == pytest.approx(plain * ratio)
    no_sms = h100.model_copy(update={"sm_count": None})
    assert no_sms.attention_time(1e12, "cudnn", 2048, backward=True, causal=True, heads=24) == pytest.approx(plain)
