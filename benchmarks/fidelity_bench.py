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
paper's figures 11-16 and 18 (the orders it reports among parallel sizes, schedules and micro-batch sizes); and
Korthikanti et al. 2022 Table 5, both halves (full recomputation; sequence
parallelism + selective recomputation), with activation memory per layer against their Table 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cluster import Link, load_cluster  # noqa: E402
from planner.device import get_device  # noqa: E402
from planner.fidelity import (  # noqa: E402
    SEQSEL,
    korthikanti_runs,
    load_tables,
    median,
    predict_fixed,
    predict_run,
    ranking_checks,
    table_runs,
    year_apart,
)
from planner.operators import OperatorOptions  # noqa: E402

GOAL_ROW, GOAL_MEDIAN = 0.10, 0.05


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processing", choices=["roofline", "no_overlap"], default=None,
                    help="override the device's kernel-time rule (default: the device file's)")
    ap.add_argument("--attention", choices=["unfused", "flash"], default="unfused")
    ap.add_argument("--no-rankings", action="store_true")
    ap.add_argument("--collectives", choices=["nccl", "flat"], default="nccl",
                    help="nccl: the device's size-dependent NCCL model (default); flat: the alpha-beta links of "
                         "before it (Calculon's 180 GB/s NVLink, 22 GB/s IB), for comparison")
    args = ap.parse_args()
    data = load_tables(ROOT / "tests" / "data" / "megatron_tables.json")
    base = load_cluster(ROOT / "examples" / "clusters" / f"{data['cluster']}.json")
    if args.collectives == "flat":  # an unknown device string: planner.cost falls back to the alpha-beta links
        base = base.model_copy(update={
            "device": f"{base.device} (flat collectives)",
            "intra": Link(alpha=3e-6, beta=1 / 180e9), "inter": Link(alpha=5e-6, beta=1 / 22e9)})
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
             "taken from a measured MAMF through that rule and every GEMM capped at that MAMF, Megatron's fp32 "
             "cross-entropy passes, the bias kernels, the mixed-precision optimizer's passes, blocking p2p, torch "
             "DDP's overlapped all-reduce and the SMs its channels take from the backward beside it "
             "(planner/contention.py), the runs' own b, v and even layer split, the collectives by NCCL's own "
             "latency/bandwidth model with measured bus bandwidths (planner/devices/a100-sxm4-80gb.json; below), "
             "the embedding's and LM head's tensor-parallel all-reduces and the cross-entropy's. The same model "
             "predicts Korthikanti et al. 2022 (the same machine and code base a year later, configurations "
             "stated; below) within 3%, so what remains is specific to the 2021 runs: five 2021 rows have a "
             "2022 twin with the same pipeline, and their micro-batches took 8-12% longer in 2021 (below). "
             "Computed and negligible here: the rendezvous of Megatron 2021's paired blocking send/recv "
             "(+0.03..0.50 s, 0.15-0.3%: a "
             "one-off replay of Megatron 2021's call order at commit 28c1d52; not in the replay), the "
             "tied-embedding all-reduce between the first and last stage (V h / t fp16 over IB: 7 ms at 175B, 12 "
             "ms at 530B per iteration), the DP buffer's scaling pass and Megatron's other optimizer passes (~16 "
             "bytes/param more than costed: ~15 ms). Missing: Table 2's fit T(d) = A/d + C leaves ~1.3 s (175B) / "
             "~2.9 s (530B) of C and 4% / 7% of A; Table 1's t <= 4 rows are short in compute alone (no pipeline, "
             "no TP on t = 1)"))
    # leave-one-out: one cluster-wide scale fitted on the other rows (what calibration, item 5, would do)
    loo = []
    for i, p in enumerate(preds):
        others = [q.run.measured_seconds() / q.seconds for j, q in enumerate(preds) if j != i]
        scale = median(others)
        loo.append(abs(p.seconds * scale / p.run.measured_seconds() - 1))
    print(f"leave-one-out with one fitted time scale per cluster (calibration, not shipped): median |error| "
          f"{median(loo):.1%}, worst {max(loo):.1%}")
    # second check: Korthikanti et al. 2022 Table 5, both halves (stated configurations)
    print_korthikanti(base, dev, opts)
    print_year_apart(data, base, dev, opts, preds)
    print_collectives(base, preds)
    if args.no_rankings:
        return
    print("\nranking claims (figures 11-16, 18; recomputation, even split, the scripts' micro-batch and schedule -- "
          "11, 13-15: plain 1F1B, micro-batch 1; 12: interleaved v=4 against 1F1B; 16: micro-batch 1-8; 18: "
          "v=4 with and without scatter/gather: examples/sc21):")
    for r in ranking_checks(data, base, dev):
        cells = ", ".join(f"t{c[0]}p{c[1]}d{c[2]}" + (f" b{c[3]} v{c[4]}" if r.figure in ("12", "16", "18") else "")
                          + ("" if c[5] else " no-s/g") + f" {s:.2f}s" for c, s in r.predicted)
        if r.trend == "gap_closes":
            gain = f" (last over first {r.gain:+.1%}: must shrink as B grows)"
        elif r.figure == "18":
            gain = f" (scatter/gather gains {r.gain:+.1%}; measured: up to 11%)"
        else:
            gain = ""
        print(f"  fig {r.figure} B={r.batch:4d} [{r.expect}] {'ok' if r.ok else 'VIOLATED'}: {cells}{gain}")


def print_year_apart(data, base, dev, opts, preds) -> None:
    """The same pipeline measured a year apart (:func:`planner.fidelity.year_apart`): what one micro-batch took
    in 2021 against 2022, and what that means for any single model of both."""
    kdata = load_tables(ROOT / "tests" / "data" / "korthikanti_table5.json")
    pairs = year_apart(data, kdata, base, dev, opts, predicted={p.run.label: p for p in preds})
    err = {p.run.label: p.error for p in preds}
    print("\nthe same pipeline a year apart (same model, t, p, v, b; SC'21 2021 vs Korthikanti 2022 full "
          "recomputation; per micro-batch = measured time / (N + (p-1)/v); net: predicted exposed DP all-reduce "
          "+ step taken out):")
    print(f"  {'pipeline':24s} {'2021 row':24s} {'d':>3s} {'2021 s/mb':>9s} {'2022 s/mb':>9s} {'ratio':>6s} "
          f"{'net':>6s} {'our error 2021':>14s}")
    for p in pairs:
        print(f"  {p.label:24s} {p.old.label:24s} {p.old.d:3d} {p.per_microbatch_old:9.4f} {p.per_microbatch_new:9.4f} "
              f"{p.ratio:6.3f} {p.ratio_net:6.3f} {err.get(p.old.label, float('nan')):+14.1%}")
    if pairs:
        low, high = min(p.ratio_net for p in pairs), max(p.ratio_net for p in pairs)
        print(f"  a micro-batch of the same pipeline took {low - 1:.1%}-{high - 1:.1%} longer in 2021 than in 2022, "
              "beyond what the data-parallel width adds (the software stack changed, not the machine): one model of "
              f"both is at best +{math.sqrt(low) - 1:.1%} on one half and -{1 - 1 / math.sqrt(low):.1%} on the other "
              f"of the closest pair (+-{math.sqrt(high) - 1:.1%} of the farthest); ours follows the 2022 one")


def print_korthikanti(base, dev, opts) -> None:
    """Korthikanti et al. 2022 Table 5, both halves in the stated t/p/b/v: full recomputation, and sequence
    parallelism + selective recomputation (``SEQSEL``, no full recomputation); then the activation memory per
    layer and GPU against their Table 2 (``34 s b h / t`` with sequence parallelism + selective; ``2 s b h``
    per fully recomputed layer, which :mod:`planner.memory` charges per layer,
    :func:`planner.cost.recompute_kept_bytes`) and the predicted peak memory per GPU (the paper states no
    measured per-GPU memory for these runs)."""
    from planner.analytic import analytic_profile
    from planner.cost import stage_infos

    kdata = load_tables(ROOT / "tests" / "data" / "korthikanti_table5.json")
    print("\nKorthikanti et al. 2022, Table 5 (configuration as stated; full: full recomputation; seqsel: "
          "sequence parallelism + selective recomputation, recompute off):")
    print(f"  {'run':5s} {'t':>2s} {'p':>3s} {'B':>4s} {'b':>2s} {'v':>2s} | {'full meas':>9s} {'pred':>7s} "
          f"{'error':>7s} {'mem GiB':>7s} | {'seqsel meas':>11s} {'pred':>7s} {'error':>7s} {'mem GiB':>7s}")
    errs: dict[str, list[float]] = {"full": [], "seqsel": []}
    mem_rows = []
    for run, row in zip(korthikanti_runs(kdata), kdata["runs"], strict=True):
        full = predict_fixed(run, row["chunks"], base, dev, opts)
        sel = predict_fixed(run, row["chunks"], base, dev, SEQSEL, recompute=False)
        ef = full.iteration_time / row["seconds_full"] - 1
        es = sel.iteration_time / row["seconds_seqsel"] - 1
        errs["full"].append(abs(ef))
        errs["seqsel"].append(abs(es))
        print(f"  {row['name']:5s} {run.t:2d} {run.p:3d} {run.batch:4d} {run.micro_batch:2d} {row['chunks']:2d} | "
              f"{row['seconds_full']:9.2f} {full.iteration_time:7.2f} {ef:+7.1%} {max(full.memory) / 2**30:7.1f} | "
              f"{row['seconds_seqsel']:11.2f} {sel.iteration_time:7.2f} {es:+7.1%} {max(sel.memory) / 2**30:7.1f}"
              + ("" if full.fits and sel.fits else " (does not fit)"))
        mem_rows.append((run, row))
    for half in ("full", "seqsel"):
        print(f"  {half:6s}: median |error| {median(errs[half]):.1%}, worst {max(errs[half]):.1%}"
              + (" (goal: every row within 5%)" if half == "seqsel" else ""))
    print("  activation memory per micro-batch (MiB): seqsel per layer and GPU, Table 2 vs our operator list; "
          "full recomputation per GPU, all its layers:")
    for run, row in mem_rows:
        spec, b, t = run.spec(), run.micro_batch or 1, run.t
        sbh = run.seq * b * run.hidden
        prof = analytic_profile(spec, dev, dtype="fp16", micro_batches=(b,), tensor_sizes=(1, t), options=SEQSEL)
        block = next(lay for lay in prof.layers if lay.kind == "transformer")
        ours = block.tensor_times[t].stashed_bytes_per_sample * b
        per_stage = run.layers // run.p  # layers per GPU (all its model chunks)
        table2_full = 2 * sbh * per_stage  # each checkpointed layer's input, replicated over t without SP
        # what planner.memory charges per in-flight micro-batch for a stage of those layers (the full rows' options)
        full_prof = analytic_profile(spec, dev, dtype="fp16", micro_batches=(b,), tensor_sizes=(1, t), options=opts)
        first = next(i for i, lay in enumerate(full_prof.layers) if lay.kind == "transformer")
        charged = stage_infos(full_prof, [(first, first + per_stage)], t)[0].recompute_kept_bytes * b
        print(f"    {row['name']:5s} seqsel 34 s b h / t = {34 * sbh / t / 2**20:7.1f}, ours {ours / 2**20:7.1f};  "
              f"full recomputation, {per_stage} layers/GPU: Table 2 2 s b h each = {table2_full / 2**20:7.1f}, "
              f"charged {charged / 2**20:7.1f}")


def print_collectives(cluster, preds) -> None:
    """The collective model on this cluster (bus bandwidth by message size) and the message sizes the rows
    produce: which part of the curve the tables exercise."""
    from planner.cost import collective_time, link_collectives

    print("\ncollectives (NCCL latency/bandwidth model, planner/devices/*.json collective_efficiency):")
    for which, op, r in (("intra", "all_reduce", 8), ("intra", "reduce_scatter", 8), ("intra", "p2p", 2),
                         ("inter", "all_reduce", 16), ("inter", "p2p", 2)):
        if link_collectives(cluster, which) is None:
            print(f"  {which} {op}: alpha-beta link (no collective model for {cluster.device})")
            continue
        factor = {"all_reduce": 2 * (r - 1) / r, "reduce_scatter": (r - 1) / r, "p2p": 1.0}[op]
        cells = []
        for mb in (0.1, 1, 6, 16, 50, 150, 1000):
            t = collective_time(cluster, which, op, r, mb * 1e6)
            cells.append(f"{mb:g} MB {factor * mb * 1e6 / t / 1e9:.0f}")
        print(f"  {which:5s} {op:14s} r={r:2d} busbw GB/s: " + ", ".join(cells))
    print("message sizes per row (fp16): TP all-reduce b s h 2, pipeline p2p b s h 2 / t, DP gradient all-reduce "
          "per GPU ~ 12 l h^2 / (p t) 2 (transformer layers):")
    for pr in preds:
        run = pr.run
        tp = pr.micro_batch * run.seq * run.hidden * 2
        dp = 12 * run.layers * run.hidden ** 2 / (run.p * run.t) * 2
        tp_mb, p2p_mb, dp_mb = (tp / 1e6 if run.t > 1 else 0), (tp / run.t / 1e6 if run.p > 1 else 0), dp / 1e6
        print(f"  {run.label:26s} TP {tp_mb:7.1f} MB  p2p {p2p_mb:6.1f} MB  DP {dp_mb if run.d > 1 else 0:8.0f} MB")


if __name__ == "__main__":
    main()
