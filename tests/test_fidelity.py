"""Predicted against measured: Megatron-LM SC'21 Tables 1 and 2 and the ranking claims of figures 13-15.

The goal of issue 11 is every row within 10% and the median within 5%. IT IS NOT MET YET: the operator
model on the shipped A100 description predicts every row 10-17% too fast (median |error| 12.1%, worst
17.1%, measured with ``python benchmarks/fidelity_bench.py``; 14-20% / 17.5% before GEMM wave
quantisation, the fp32 cross-entropy passes, the bias kernels and the mixed-precision optimizer's gradient
passes were modelled), uniformly so: one cluster-wide time scale fitted on the other rows brings each row
within 5.7% (leave-one-out). The same model predicts Korthikanti et al. 2022 Table 5
(tests/data/korthikanti_table5.json) within 1.0-6.9%. The thresholds below are the
figures reached (regression guards), not the goal. No constant of the model is fitted to these rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.device import get_device
from planner.fidelity import (
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
GUARD_ROW, GUARD_MEDIAN, GUARD_SPREAD, GUARD_LOO = 0.175, 0.125, 0.075, 0.06  # reached (module docstring)
GUARD_K_ROW, GUARD_K_MEDIAN = 0.075, 0.04  # Korthikanti et al. 2022 Table 5: reached 6.9% worst, 3.7% median
#: ranking claims the model does not reproduce yet: (figure, batch). Figure 13 at B = 512 predicts
#: (t, p) = (4, 16) 0.7% faster than the measured best (8, 8) (the bubble is small at 512 micro-batches and
#: the t = 4 GEMMs are larger; what made (8, 8) faster in the measured run is not in the model).
#: Figure 14 at B = 32 (4 micro-batches per replica at p = 8, d = 8): (p, d) = (16, 4) is predicted 1.3%
#: faster than (8, 8) (0.936 s vs 0.948 s): its data-parallel all-reduce is half as large (0.076 s vs 0.145 s
#: exposed) and the bubble grows less than that; this appeared when the LM head's fp32 cross-entropy passes
#: were costed (the last stage grew, and with it both bubbles).
KNOWN_RANKING_DEVIATIONS = {("13", 512), ("14", 32)}


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
def test_ranking_claims_of_figures_13_to_15():
    base = load_cluster(ROOT / "examples" / "clusters" / f"{DATA['cluster']}.json")
    results = ranking_checks(DATA, base, get_device(DATA["device"]))
    assert len(results) == 8
    violated = {(r.figure, r.batch) for r in results if not r.ok}
    assert violated <= KNOWN_RANKING_DEVIATIONS, [(r.figure, r.batch, r.predicted) for r in results if not r.ok]
    # crossing a node with t is predicted slower, as measured (figures 13 and 15)
    for r in results:
        times = dict(r.predicted)
        t8 = [s for c, s in times.items() if c[0] == 8]
        t16 = [s for c, s in times.items() if c[0] == 16]
        if t8 and t16:
            assert t16[0] > t8[0]


def test_candidate_configs_follow_the_papers_rules():
    """Interleaved where p > 1 with v dividing the layers per stage and m a multiple of p, 1F1B where p = 1;
    a stated micro-batch size is the only one tried."""
    from planner.fidelity import candidate_configs

    t1 = table_runs(DATA, "table1")
    one = candidate_configs(t1[0])  # p = 1, B/d = 16
    assert {c.schedule for c in one} == {"1f1b"} and sorted(c.micro_batch for c in one) == [1, 2, 4, 8]
    big = candidate_configs(t1[9])  # 128 layers on p = 64: 2 per stage, v = 2 only
    assert {(c.schedule, c.chunks) for c in big} == {("interleaved", 2)}
    t2 = candidate_configs(table_runs(DATA, "table2")[0])  # micro-batch 1 stated; 8 layers per stage
    assert {c.micro_batch for c in t2} == {1} and {c.chunks for c in t2} == {2, 4}
    assert all(c.recompute for c in one + big + t2)


@pytest.mark.slow
def test_korthikanti_table5_within_reached_error():
    """The second published check, in its stated configurations: every full-recomputation row of
    Korthikanti et al. 2022 Table 5 within the reached error (the goal of 10% / 5% is met), all predicted fast (the sign
    says the model misses work; a row predicted slow would be a new kind of error)."""
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
    assert all(e < 0 for e in errs), errs
