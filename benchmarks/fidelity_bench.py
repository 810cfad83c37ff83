"""Fidelity: predicted against measured iteration times of published Megatron-LM runs.

Run: ``python benchmarks/fidelity_bench.py [--processing roofline|no_overlap] [--attention unfused|flash]``.

Predicts every row of Megatron-LM SC'21 Table 1 and Table 2 (tests/data/megatron_tables.json) with the
shipped A100 device description and DGX A100 cluster (no constant fitted to these rows), each in the
configuration the run used (micro-batch size, model chunks, DDP implementation: the paper's reproduction
scripts, NVIDIA/Megatron-LM examples/sc21, see tests/data/megatron_tables.json and planner/fidelity.py;
Megatron's even layer split), and prints per row the measured and predicted seconds per iteration, the
error, the micro-batch size and schedule, and the predicted
peak memory per GPU (the paper states no per-GPU memory for these rows: it is shown against the 80 GB of
the device). Then the median and worst absolute error against the goal (every row within 10%, median
within 5%), a leave-one-out calibration figure (what one cluster-wide time scale fitted on the other rows
would give: the calibration of issue 11 item 5, not a shipped constant), and the ranking claims of the
paper's figures 13-15.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cluster import load_cluster  # noqa: E402
from planner.device import get_device  # noqa: E402
from planner.fidelity import (  # noqa: E402
    korthikanti_runs,
    load_tables,
    median,
    predict_fixed,
    predict_run,
    ranking_checks,
    table_runs,
)
from planner.operators import OperatorOptions  # noqa: E402

GOAL_ROW, GOAL_MEDIAN = 0.10, 0.05


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processing", choices=["roofline", "no_overlap"], default=None,
                    help="override the device's kernel-time rule (default: the device file's)")
    ap.add_argument("--attention", choices=["unfused", "flash"], default="unfused")
    ap.add_argument("--no-rankings", action="store_true")
    args = ap.parse_args()
    data = load_tables(ROOT / "tests" / "data" / "megatron_tables.json")
    base = load_cluster(ROOT / "examples" / "clusters" / f"{data['cluster']}.json")
    dev = get_device(data["device"])
    if args.processing:
        dev = dev.model_copy(update={"processing": args.processing})
    opts = OperatorOptions(attention=args.attention, dropout=True)
    print(f"device {dev.name} ({dev.processing}), cluster {base.name}, {args.attention} attention, fp16, "
          "full recomputation, Megatron's even layer split; b, v and DDP as in examples/sc21 (Table 2's v assumed "
          "from the same scripts)")
    head = (f"{'row':26s} {'t':>2s} {'p':>3s} {'d':>4s} {'B':>5s} {'b':>2s} {'schedule':>14s} {'meas s':>8s} "
            f"{'pred s':>8s} {'error':>7s} {'TF/s meas':>9s} {'TF/s pred':>9s} {'mem GiB':>7s} compute")
    print(head)
    t0 = time.perf_counter()
    preds = []
    for table in ("table1", "table2"):
        for run in table_runs(data, table):
            pr = predict_run(run, base, dev, options=opts)
            preds.append(pr)
            sched = pr.schedule + (f"(v={pr.chunks})" if pr.chunks else "")
            tf_pred = run.flops() / (run.gpus * pr.seconds) / 1e12
            print(f"{run.label:26s} {run.t:2d} {run.p:3d} {run.d:4d} {run.batch:5d} {pr.micro_batch:2d} {sched:>14s} "
                  f"{run.measured_seconds():8.2f} {pr.seconds:8.2f} {pr.error:+7.1%} {run.tflops:9.0f} {tf_pred:9.0f} "
                  f"{pr.peak_memory / 2**30:7.1f}{'' if pr.fits else ' (does not fit)'} {pr.compute}")
    errs = [abs(p.error) for p in preds]
    med, worst = median(errs), max(errs)
    signed = median([p.error for p in preds])
    print(f"\n{len(preds)} rows in {time.perf_counter() - t0:.1f} s: median |error| {med:.1%}, worst {worst:.1%}, "
          f"median signed error {signed:+.1%}")
    met = worst <= GOAL_ROW and med <= GOAL_MEDIAN
    print(f"goal (every row within {GOAL_ROW:.0%}, median within {GOAL_MEDIAN:.0%}): "
          + ("MET" if met else "NOT MET -- the predictions are uniformly fast (see the signed error). Modelled: "
             "wave/tile quantisation of each GEMM on 108 SMs, the no_overlap kernel rule with the GEMM ceiling "
             "taken from a measured MAMF through that rule, Megatron's fp32 cross-entropy passes, the bias "
             "kernels, the mixed-precision optimizer's passes, blocking p2p, torch DDP's overlapped "
             "all-reduce, the runs' own b, v and even layer split, the tensor-parallel collectives at "
             "Calculon's achieved NVLink bandwidth (180 GB/s, examples/clusters/dgx-a100-80gb.json), the "
             "embedding's and LM head's tensor-parallel all-reduces and the cross-entropy's. The same "
             "model predicts Korthikanti et al. 2022 (the same machine and code base a year later, "
             "configurations stated; below) within 2%, so what remains is specific to the 2021 runs. "
             "Computed and negligible here: the rendezvous of Megatron 2021's paired blocking send/recv "
             "(+0.03..0.50 s, 0.15-0.3%: measured by a one-off replay of Megatron 2021's call order at commit 28c1d52, not in the replay), the "
             "tied-embedding all-reduce between the first and last stage "
             "(V h / t fp16 over IB: 7 ms at 175B, 12 ms at 530B per iteration), the DP buffer's scaling pass "
             "and Megatron's other optimizer passes (~16 bytes/param more than costed: ~15 ms). Missing: "
             "Table 2's fit T(d) = A/d + C leaves ~1.3 s (175B) / ~2.9 s (530B) of C and 4% / 7% of A; "
             "Table 1's t <= 4 rows are short in compute alone (no pipeline, no TP on t = 1)"))
    # leave-one-out: one cluster-wide scale fitted on the other rows (what calibration, item 5, would do)
    loo = []
    for i, p in enumerate(preds):
        others = [q.run.measured_seconds() / q.seconds for j, q in enumerate(preds) if j != i]
        scale = median(others)
        loo.append(abs(p.seconds * scale / p.run.measured_seconds() - 1))
    print(f"leave-one-out with one fitted time scale per cluster (calibration, not shipped): median |error| "
          f"{median(loo):.1%}, worst {max(loo):.1%}")
    # second check: Korthikanti et al. 2022 Table 5 (stated configurations, full recomputation)
    kdata = load_tables(ROOT / "tests" / "data" / "korthikanti_table5.json")
    print("\nKorthikanti et al. 2022, Table 5 (full recomputation, configuration as stated):")
    kerrs = []
    for run, row in zip(korthikanti_runs(kdata), kdata["runs"], strict=True):
        cand = predict_fixed(run, row["chunks"], base, dev, opts)
        err = cand.iteration_time / row["seconds_full"] - 1
        kerrs.append(abs(err))
        print(f"  {row['name']:5s} t={run.t} p={run.p:2d} B={run.batch:3d} b={run.micro_batch} v={row['chunks']}: "
              f"measured {row['seconds_full']:6.2f} s, predicted {cand.iteration_time:6.2f} s, error {err:+6.1%}")
    print(f"  median |error| {median(kerrs):.1%}, worst {max(kerrs):.1%}")
    if args.no_rankings:
        return
    print("\nranking claims (figures 13-15; plain 1F1B, micro-batch 1, recomputation, even split: examples/sc21):")
    for r in ranking_checks(data, base, dev):
        cells = ", ".join(f"t{c[0]}p{c[1]}d{c[2]} {s:.2f}s" for c, s in r.predicted)
        print(f"  fig {r.figure} B={r.batch:4d} [{r.expect}] {'ok' if r.ok else 'VIOLATED'}: {cells}")


if __name__ == "__main__":
    main()
