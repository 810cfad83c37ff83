"""Fidelity on H100: predicted against measured iteration times of NVIDIA's published DGX H100 BF16 runs.

Run: ``python benchmarks/fidelity_h100_bench.py [--no-analysis]``.

The rows (tests/data/h100_public_runs.json) are NVIDIA's DGX Cloud Benchmarking recipes (NVIDIA/dgxc-benchmarking,
"Expected Performance", BF16 on DGX H100, NeMo Megatron with Megatron-Core and Transformer Engine): GPT-3 175B
(t 4, p 8, VP 12), Nemotron-4 15B (t 4, p 1, MBS 4) and Nemotron-4 340B (t 8, p 8, VP 12), each weak-scaled
over 16-2048 GPUs; CP = 1, no FSDP, no experts. (The Megatron-Bridge and NeMo performance summaries publish
dense DGX-H100 rows in FP8 only: see the file's ``sources_without_bf16_dense_h100_rows``.)

Each row is predicted in its stated configuration with the shipped H100 description and the DGX H100 cluster
(examples/clusters/dgx-h100-80gb.json; nothing fitted to these rows): bf16, the flash kernel (causal),
sequence parallelism, the recipe's dropout and selective recomputation, gradient-accumulation fusion, the
distributed optimizer's sharded state (4 + 12/d bytes per parameter), non-blocking pipeline sends, Megatron's
even layer split, and the recipe's tensor-parallel communication overlap (``tp_comm_overlap``: the ideal
limit, :meth:`planner.cost.ConfigCosts._tp_exposed`). Printed per row: measured and predicted seconds, error,
model memory against 80 GiB. Then (unless ``--no-analysis``) the gap per term on the first row of each model:
what each missing or assumed mechanism moves, as counterfactual predictions (none of them shipped):

* TP collectives fully exposed (no overlap) and removed (an upper and a lower bound on their cost);
* the data-parallel reduction's exposed part (the simulator's ``allreduce_exposed``) and without it;
* GEMMs capped at the measured MAMF (792.1 TFLOP/s, stas00/ml-engineering, the source the H100 description's
  curve is scaled to: no GEMM can beat the best shape of the sweep, while the no_overlap rule derives a
  curve top that lets large-k GEMMs exceed it);
* the flash kernel at FlashAttention-2's H100 utilisation (35% of peak: Shah et al. 2024, FlashAttention-3,
  arXiv 2407.08608, abstract) instead of the GEMM curve;
* the three together with the recipe's overlap.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cluster import load_cluster  # noqa: E402
from planner.device import DeviceSpec, get_device  # noqa: E402
from planner.fidelity import load_tables, median, predict_public, public_runs  # noqa: E402

DATA = ROOT / "tests" / "data" / "h100_public_runs.json"
CLUSTER = ROOT / "examples" / "clusters" / "dgx-h100-80gb.json"
DEVICE = "H100-SXM5-80GB"
#: stas00/ml-engineering compute/accelerator README, "Maximum Achievable Matmul FLOPS comparison table", H100 SXM
#: bf16 (the figure planner/devices/h100-sxm5-80gb.json cites)
MAMF_TFLOPS = 792.1
#: FlashAttention-2's utilisation of the H100 (FlashAttention-3 paper, Shah et al. 2024, abstract: "only 35%")
FA2_H100_UTILISATION = 0.35


class CounterfactualDevice(DeviceSpec):
    """The shipped device with two counterfactual kernel rules (analysis only): every GEMM at most
    ``gemm_cap`` FLOP/s, and batched GEMM shapes (with flash attention, only the flash kernel has a batch) at
    ``attention_utilisation`` of the peak."""

    gemm_cap: float | None = None
    attention_utilisation: float | None = None

    def kernel_time(self, flops: float, nbytes: float, *, gemm: tuple[int, int, int, int] | None = None,
                    dtype: str = "bf16") -> float:
        t = super().kernel_time(flops, nbytes, gemm=gemm, dtype=dtype)
        if gemm is None or flops <= 0:
            return t
        if self.attention_utilisation is not None and gemm[3] > 1:
            return flops / (self.peak(dtype) * self.attention_utilisation) + self.kernel_overhead_s
        if self.gemm_cap is not None:
            return max(t, flops / self.gemm_cap + self.kernel_overhead_s)
        return t


def counterfactual(dev: DeviceSpec, **kw) -> DeviceSpec:
    return CounterfactualDevice(**dev.model_dump(), **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-analysis", action="store_true", help="only the per-row table")
    args = ap.parse_args()
    data = load_tables(DATA)
    base = load_cluster(CLUSTER)
    dev = get_device(DEVICE)
    runs = public_runs(data)
    print(f"device {dev.name} ({dev.processing}), cluster {base.name}; NVIDIA dgxc-benchmarking BF16 rows "
          f"(@ {data['source']['commit'][:10]}), stated t/p/VP/MBS, recipe's TP overlap (ideal), no full recomputation")
    print(f"{'row':22s} {'t':>2s} {'p':>2s} {'v':>2s} {'d':>4s} {'GBS':>5s} {'b':>2s} {'TPovl':>5s} {'meas s':>7s} "
          f"{'pred s':>7s} {'error':>7s} {'no-ovl s':>8s} {'error':>7s} {'mem GiB':>7s}")
    t0 = time.perf_counter()
    errs, errs_noov = [], []
    for run in runs:
        cand = predict_public(run, base, dev)
        noov = predict_public(run, base, dev, tp_comm_overlap=False)
        meas = run.measured_seconds()
        e, e2 = cand.iteration_time / meas - 1, noov.iteration_time / meas - 1
        errs.append(e)
        errs_noov.append(e2)
        mem = max(cand.memory) / 2**30
        over = " (over 80 GiB: the run fit)" if max(cand.memory) > base.memory_bytes else ""
        print(f"{run.label:22s} {run.t:2d} {run.p:2d} {run.chunks:2d} {run.d:4d} {run.batch:5d} {run.micro_batch:2d} "
              f"{'yes' if run.recipe.get('tp_comm_overlap') else 'no':>5s} {meas:7.3f} {cand.iteration_time:7.3f} "
              f"{e:+7.1%} {noov.iteration_time:8.3f} {e2:+7.1%} {mem:7.1f}{over}")
    for name, es in (("as configured (recipe's TP overlap, ideal)", errs), ("TP collectives fully exposed", errs_noov)):
        print(f"{name}: {len(es)} rows, median |error| {median([abs(x) for x in es]):.1%}, worst "
              f"{max(abs(x) for x in es):.1%}, median signed {median(es):+.1%}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    if not args.no_analysis:
        analysis(runs, base, dev)


def analysis(runs, base, dev) -> None:
    """The gap per term on the first (smallest) row of each model: counterfactual predictions."""
    capped = counterfactual(dev, gemm_cap=MAMF_TFLOPS * 1e12)
    fa2 = counterfactual(dev, attention_utilisation=FA2_H100_UTILISATION)
    both = counterfactual(dev, gemm_cap=MAMF_TFLOPS * 1e12, attention_utilisation=FA2_H100_UTILISATION)
    print("\ngap per term (first row of each model; seconds per iteration; error against measured):")
    seen = set()
    for run in runs:
        if run.model in seen:
            continue
        seen.add(run.model)
        meas = run.measured_seconds()
        cfg = predict_public(run, base, dev)
        exp = predict_public(run, base, dev, tp_comm_overlap=False)
        hid = predict_public(run, base, dev, tp_comm_overlap=True)
        br = cfg.breakdown
        rows = [("as configured", cfg.iteration_time),
                ("TP collectives fully exposed", exp.iteration_time),
                ("TP collectives hidden (ideal overlap)", hid.iteration_time),
                ("DP reduction fully hidden (minus allreduce_exposed)",
                 cfg.iteration_time - br.get("allreduce_exposed", 0.0)),
                (f"GEMMs capped at MAMF {MAMF_TFLOPS:g} TFLOP/s", predict_public(run, base, capped).iteration_time),
                (f"flash kernel at FA2's {FA2_H100_UTILISATION:.0%} of peak",
                 predict_public(run, base, fa2).iteration_time),
                ("MAMF cap + FA2 rate", predict_public(run, base, both).iteration_time),
                ("MAMF cap + FA2 rate, TP fully exposed",
                 predict_public(run, base, both, tp_comm_overlap=False).iteration_time),
                ("blocking pipeline sends (p2p = blocking)",
                 predict_public(run, base, dev, environment={"p2p": "blocking"}).iteration_time)]
        print(f"  {run.label} (measured {meas:.3f} s; simulated bubble {br.get('bubble', 0.0):.3f} s, "
              f"DP exposed {br.get('allreduce_exposed', 0.0):.3f} s, optimizer step {br.get('step', 0.0):.3f} s, "
              f"TP collectives {exp.iteration_time - hid.iteration_time:.3f} s on the critical path when exposed):")
        for name, s in rows:
            print(f"    {name:52s} {s:7.3f} s  {s / meas - 1:+7.1%}")
        extra = (f"; Megatron-Core's selective re-run of the flash forward +{selective_flash_rerun(run, dev):.3f} s"
                 if run.recipe["recompute"] == "selective" else "")
        print(f"    estimates: DP reduction in fp32 instead of bf16 +{br.get('allreduce_exposed', 0.0):.3f} s exposed "
              f"at most{extra}")


def selective_flash_rerun(run, dev: DeviceSpec) -> float:
    """Seconds per iteration per device of re-running the flash kernel's forward in the backward, as
    Megatron-Core's selective recomputation does (``CheckpointWithoutOutput`` of the core attention, also
    with Transformer Engine's fused kernel), which the operator model does not cost with flash attention:
    the flash forward of one layer times the layers per device times the micro-batches per replica."""
    from planner.operators import layer_operators

    ops = layer_operators(run.spec, run.micro_batch, run.t, run.options())
    flash = sum(k.time(dev, "bf16") for op in ops if op.name == "flash_attn" for k in op.fwd)
    micro_batches = run.batch // (run.d * run.micro_batch)
    return flash * (run.spec.layers // run.p) * micro_batches


if __name__ == "__main__":
    main()
