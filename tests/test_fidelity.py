"""Predicted against measured: Megatron-LM SC'21 Tables 1 and 2 and the ranking claims of figures 11-16 and 18.

The goal of issue 11 is every row within 10% and the median within 5%. IT IS NOT MET YET: in the runs' own
configurations (micro-batch size, model chunks and DDP implementation from the paper's reproduction scripts,
NVIDIA/Megatron-LM examples/sc21; Megatron's even layer split) the operator model on the shipped A100 description
predicts every row 7.7-15.0% too fast (median |error| 11.3%, worst 15.0%, measured with ``python
benchmarks/fidelity_bench.py``), uniformly so: one cluster-wide time scale fitted on the other rows would bring each
row within 4.2% (leave-one-out; 4.4% before torch DDP's overlapped all-reduce was charged what its channels take
from the backward beside it, :mod:`planner.contention`: 11.4% median before). Every GEMM is capped at the A100's
measured maximum achievable matmul FLOPS (267.9 TFLOP/s, planner/devices/a100-sxm4-80gb.json
``gemm_ceiling_flops``); before the cap the wide t = 1-8 GEMMs of b >= 2 ran at up to 290 TFLOP/s and the rows were
7.7-15.4% fast (worst 15.4%, leave-one-out 4.7%). The collectives are NCCL's own latency/bandwidth model with
measured large-message bus bandwidths (planner/devices/a100-sxm4-80gb.json ``collective_efficiency``: an 8-GPU
NVLink all-reduce of 50 MB at ~200 GB/s busbw, 230 GB/s at GBs); with Calculon's flat 180 GB/s NVLink figure before
it the rows were 5.2-12.6% fast (median 9.1%, worst 12.6%; Korthikanti within 1.7%): better sourced, further from
the tables. Earlier figures: 9.5% / 12.8% without the embedding's and LM head's tensor-parallel all-reduces; 12.4% /
16.6% with NVLink collectives at an unsourced 250 GB/s (now Calculon's 180 GB/s,
examples/clusters/dgx-a100-80gb.json); 12.1% / 17.1% with the fastest predicted b and v, the roofline kernel rule,
the LM head's forward counted twice under recomputation and torch DDP's all-reduce left after the backward; 14-20% /
17.5% before GEMM wave quantisation, the fp32 cross-entropy passes, the bias kernels and the mixed-precision
optimizer's gradient passes. The same model predicts Korthikanti et al. 2022 Table 5
(tests/data/korthikanti_table5.json, the same machine and code a year later) within 2.8% (1.5-2.8%, all fast, median
1.9%; 1.7% at 180 GB/s, 2.8-4.1% at 250 GB/s NVLink). The second half of Table 5 (sequence parallelism + selective
recomputation, no full recomputation: the paper's method) is predicted within 2.2% (-2.2%, -0.5%, -2.0%, +0.6%; goal
5%; +0.4% on the 1T row before the MAMF cap), with the backward's re-gather of the sequence-parallel GEMM inputs
costed (without it -5.8% to -1.3%). The thresholds below are the figures reached (regression guards), not the goal.
No constant of the model is fitted to these rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.device import get_device
from planner.fidelity import (
    SEQSEL,
    korthikanti_runs,
    load_tables,
    median,
    predict_fixed,
    predict_run,
    ranking_checks,
    table_runs,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = load_tables(ROOT / "tests" / "data" / "megatron_tables.json")
GOAL_ROW, GOAL_MEDIAN = 0.10, 0.05  # issue 11: not met yet
GUARD_ROW, GUARD_MEDIAN, GUARD_SPREAD, GUARD_LOO = 0.155, 0.12, 0.08, 0.05  # reached (module docstring)
GUARD_K_ROW, GUARD_K_MEDIAN = 0.03, 0.025  # Korthikanti et al. 2022 Table 5: reached 2.8% worst, 1.9% median
#: the sequence-parallel + selective half of Table 5 (goal: every row within 5%): reached -2.2%, -1.1%, -3.3%,
#: +0.2% (worst 3.3%, median 1.6%) since the pipeline sends under sequence parallelism gather nothing (Megatron-LM
#: 2022 turns scatter/gather off there: each rank sends its 1/t of the sequence, which the next stage takes as
#: it is; before, an all-gather of the whole tensor was charged per send: -2.2%, -0.5%, -2.0%, +0.6%); without
#: the backward's re-gather of the column-parallel inputs (``ConfigCosts._sp_regather``) -5.8% to -1.3%
GUARD_SEQSEL_ROW, GUARD_SEQSEL_MEDIAN = 0.04, 0.02
#: ranking claims the model does not reproduce yet: (figure, batch). Figure 13 at B = 128 predicts (t, p) =
#: (4, 16) 0.3% faster than the measured best (8, 8) (28.39 s vs 28.47 s with NCCL's size-dependent collectives
#: and the MAMF cap; 28.24 s without the cap;
#: 1.8% at Calculon's flat 180 GB/s NVLink, 0.3% at the earlier, unsourced 250 GB/s, which favoured t = 8's
#: larger share of tensor-parallel traffic): a near-tie within the model's
#: resolution, decided among others by the wave quantisation of the t = 8 QKV GEMM (480 tiles of 256 x 128
#: on 108 SMs: 4.4 waves run as 5) against p = 16's larger bubble; it appeared when the LM head stopped being
#: recomputed.
#: Figure 14 at B = 32 holds since the runs are predicted with Megatron's even layer split (the time-balanced
#: partition moved layers off the LM head's stage; the measured runs could not), and figure 13's batch sizes
#: are the paper's (32 and 128: examples/sc21/run_figure_13.sh; a B = 512 claim had no source).
KNOWN_RANKING_DEVIATIONS = {("13", 128)}


@pytest.fixture(scope="module")
def predictions():
    base = load_cluster(ROOT / "examples" / "clusters" / f"{DATA['cluster']}.json")
    dev = get_device(DATA["device"])
    return [predict_run(run, base, dev) for t in ("table1", "table2") for run in table_runs(DATA, t)]


def test_tables_are_the_papers():
    """The data: 10 + 6 rows; measured seconds from the paper's TFLOP/s (Table 1's 1T row: 102.6 s)."""
    rows = table_runs(DATA, "table1") + table_runs(DATA, "table2")
    assert len(rows) == 16
    assert rows[9].measured_seconds() == pytest.approx(102.63, rel=1e-3)
    assert rows[0].measured_seconds() == pytest.approx(3.53, rel=2e-3)
    assert all(r.d * r.t * r.p == r.gpus for r in rows)


@pytest.mark.slow
def test_megatron_rows_within_the_reached_error(predictions):
    errs = [abs(p.error) for p in predictions]
    assert all(p.fits for p in predictions), [p.run.label for p in predictions if not p.fits]
    assert all(p.compute == "per-t operators" for p in predictions)
    assert max(errs) <= GUARD_ROW, [(p.run.label, round(p.error, 3)) for p in predictions]
    assert median(errs) <= GUARD_MEDIAN
    signed = [p.error for p in predictions]
    assert max(signed) - min(signed) <= GUARD_SPREAD  # the error is a uniform bias, not scatter
    # the goal, stated so that meeting it is visible: flip these when it is met
    assert not (max(errs) <= GOAL_ROW and median(errs) <= GOAL_MEDIAN)


@pytest.mark.slow
def test_one_cluster_scale_would_bring_rows_within_guard(predictions):
    """Leave-one-out: a time scale fitted on the other rows (what calibration does) predicts each row."""
    for i, p in enumerate(predictions):
        scale = median([q.run.measured_seconds() / q.seconds for j, q in enumerate(predictions) if j != i])
        assert abs(p.seconds * scale / p.run.measured_seconds() - 1) <= GUARD_LOO, p.run.label


@pytest.mark.slow
def test_ranking_claims_of_figures_11_to_16_and_18():
    base = load_cluster(ROOT / "examples" / "clusters" / f"{DATA['cluster']}.json")
    results = ranking_checks(DATA, base, get_device(DATA["device"]))
    assert len(results) == 21
    violated = {(r.figure, r.batch) for r in results if not r.ok}
    assert violated <= KNOWN_RANKING_DEVIATIONS, [(r.figure, r.batch, r.predicted) for r in results if not r.ok]
    # crossing a node with t is predicted slower, as measured (figures 13 and 15)
    for r in results:
        times = dict(r.predicted)
        t8 = [s for c, s in times.items() if c[0] == 8]
        t16 = [s for c, s in times.items() if c[0] == 16]
        if t8 and t16:
            assert t16[0] > t8[0]
    # figure 12: interleaving gains at every batch size, less as the batch grows; figure 11: a deeper pipeline
    # (weak scaling) loses less at the larger batch; figure 16: b = 2 is fastest
    for figure, n in (("12", 5), ("11", 2)):
        gains = [r.gain for r in results if r.figure == figure]
        assert len(gains) == n and all(g > 0 for g in gains)
        assert gains == sorted(gains, reverse=True)
    for r in results:
        if r.figure == "16":
            assert min(r.predicted, key=lambda x: x[1])[0][3] == 2
    # figure 18: the scatter/gather sends (1/t over each rank's IB link, then gathered) beat whole ones at every
    # batch size; the measured gain is "up to 11%", the model's 6.7% throughout (blocking sends: every F and B
    # holds its send, the bubble's too)
    gains = [r.gain for r in results if r.figure == "18"]
    assert len(gains) == 5 and all(0.03 < g < 0.11 for g in gains), gains


def test_a_ranking_claim_fails_when_the_prediction_breaks_it():
    """The checks can fail: figure 16's claim turned around (b = 8 best) is reported violated, and so is figure
    12's trend where the gap is made to widen (its batch sizes listed largest first)."""
    base = load_cluster(ROOT / "examples" / "clusters" / f"{DATA['cluster']}.json")
    fig12, fig16 = ({**c} for c in DATA["rankings"] if c["figure"] in ("12", "16"))
    fig16["best"] = [8, 8, 1, 8]
    fig16["batches"] = [128]
    fig12["batches"] = [36, 12]
    results = ranking_checks({**DATA, "rankings": [fig12, fig16]}, base, get_device(DATA["device"]))
    assert [(r.figure, r.batch, r.ok) for r in results] == [("12", 36, True), ("12", 12, False), ("16", 128, False)]


def test_candidate_configs_follow_the_papers_rules():
    """A run's stated b and v (Table 1: the reproduction scripts; Table 2: b = 1 stated, v from the scripts)
    are the only configuration tried; for a run that states neither, interleaved where p > 1 with v dividing
    the layers per stage and m a multiple of p, 1F1B where p = 1, every b dividing the per-replica batch."""
    from dataclasses import replace

    from planner.fidelity import candidate_configs

    t1 = table_runs(DATA, "table1")
    assert [(r.micro_batch, r.chunks) for r in t1] == [(16, 1), (16, 1), (16, 1), (8, 1), (4, 1), (2, 3), (2, 2),
                                                       (1, 2), (1, 3), (1, 1)]
    for run in t1 + table_runs(DATA, "table2"):
        (cfg,) = candidate_configs(run)
        assert cfg.micro_batch == run.micro_batch and cfg.recompute
        assert (cfg.schedule, cfg.chunks) == (("interleaved", run.chunks) if run.chunks > 1 else ("1f1b", None))
    one = candidate_configs(replace(t1[0], micro_batch=None, chunks=None))  # p = 1, B/d = 16
    assert {c.schedule for c in one} == {"1f1b"} and sorted(c.micro_batch for c in one) == [1, 2, 4, 8]
    big = candidate_configs(replace(t1[9], micro_batch=None, chunks=None))  # 128 layers on p = 64: v = 2 only
    assert {(c.schedule, c.chunks) for c in big} == {("interleaved", 2)}


def test_megatron_split_is_even_with_embedding_first_and_head_last():
    from planner.fidelity import megatron_split

    assert megatron_split(4, 2) == [(0, 3), (3, 6)]  # [emb, b0, b1] [b2, b3, head]
    assert megatron_split(96, 48)[0] == (0, 3) and megatron_split(96, 48)[-1] == (95, 98)
    with pytest.raises(ValueError, match="evenly"):
        megatron_split(10, 4)


@pytest.mark.slow
def test_korthikanti_table5_within_reached_error():
    """The second published check, in its stated configurations: every full-recomputation row of
    Korthikanti et al. 2022 Table 5 within the reached error (the goal of 10% / 5% is met; the errors,
    -2.8% to -1.5% with NCCL's size-dependent collectives; -0.7% to +1.7% at a flat 180 GB/s NVLink)."""
    data = load_tables(ROOT / "tests" / "data" / "korthikanti_table5.json")
    base = load_cluster(ROOT / "examples" / "clusters" / f"{data['cluster']}.json")
    dev = get_device(data["device"])
    errs = []
    for run, row in zip(korthikanti_runs(data), data["runs"], strict=True):
        cand = predict_fixed(run, row["chunks"], base, dev)
        errs.append(cand.iteration_time / row["seconds_full"] - 1)
    assert len(errs) == 4
    assert max(abs(e) for e in errs) <= GUARD_K_ROW, errs
    assert median([abs(e) for e in errs]) <= GUARD_K_MEDIAN, errs


@pytest.mark.slow
def test_korthikanti_table5_seqsel_within_reached_error():
    """The other half of Table 5: sequence parallelism + selective recomputation (the paper's method), the
    same t/p/b/v, no full recomputation. Goal: every row within 5%; the bound is the error reached plus a
    small margin (GUARD_SEQSEL_*). And the physics the half exercises: selective beats full recomputation on
    every row, as measured (1.42 -> 1.10 s ... 94.42 -> 71.49 s)."""
    data = load_tables(ROOT / "tests" / "data" / "korthikanti_table5.json")
    base = load_cluster(ROOT / "examples" / "clusters" / f"{data['cluster']}.json")
    dev = get_device(data["device"])
    errs = []
    for run, row in zip(korthikanti_runs(data), data["runs"], strict=True):
        sel = predict_fixed(run, row["chunks"], base, dev, SEQSEL, recompute=False)
        assert sel.fits, row["name"]
        errs.append(sel.iteration_time / row["seconds_seqsel"] - 1)
        full = predict_fixed(run, row["chunks"], base, dev)
        assert sel.iteration_time < full.iteration_time, row["name"]
    assert len(errs) == 4
    assert max(abs(e) for e in errs) <= GUARD_SEQSEL_ROW, errs
    assert median([abs(e) for e in errs]) <= GUARD_SEQSEL_MEDIAN, errs


def test_the_same_pipeline_ran_slower_in_2021_than_in_2022(predictions):
    """The published data themselves: 530B (t=8, p=35, v=3, b=1; Table 2 at d = 2, 4, 8 and Table 1 at d = 9)
    and 1T (t=8, p=64, v=1, b=1; Table 1 at d = 6) were also run by Korthikanti et al. 2022 with full
    recomputation on the same machine. Per micro-batch slot (``N + (p-1)/v``), with the predicted data-parallel
    all-reduce and step taken out, the 2021 runs took 8.3-12.4% longer: the residual of the module docstring
    that no single physics model of one software stack can bring within a few percent of both years."""
    from planner.fidelity import year_apart

    base = load_cluster(ROOT / "examples" / "clusters" / f"{DATA['cluster']}.json")
    kdata = load_tables(ROOT / "tests" / "data" / "korthikanti_table5.json")
    pairs = year_apart(DATA, kdata, base, get_device(DATA["device"]))
    assert sorted((p.new.label.split()[1], p.old.d) for p in pairs) == [
        ("1T", 6), ("530B", 2), ("530B", 4), ("530B", 8), ("530B", 9)]
    for p in pairs:
        assert 1.08 < p.ratio_net <= p.ratio < 1.14, p.label
        # the d = 2 pair: almost nothing of the gap is data parallelism
        if p.old.d == 2:
            assert p.ratio - p.ratio_net < 0.002
    # the caller's own predictions of the 2021 rows are used as they are (the bench passes the table's; here
    # the module's, made with the same cluster and device)
    from planner.fidelity import table_runs

    dev = get_device(DATA["device"])
    runs = [r for t in ("table1", "table2") for r in table_runs(DATA, t)]
    given = {r.label: pr for r, pr in zip(runs, predictions, strict=True)}
    again = year_apart(DATA, kdata, base, dev, predicted=given)
    assert [(q.label, q.old.label, q.dp_old, q.dp_new) for q in again] == [
        (p.label, p.old.label, p.dp_old, p.dp_new) for p in pairs]
    fake = {label: replace(pr, breakdown={"allreduce_exposed": 1.0}) for label, pr in given.items()}
    assert all(q.dp_old == 1.0 for q in year_apart(DATA, kdata, base, dev, predicted=fake)
               if q.old.label in fake)
