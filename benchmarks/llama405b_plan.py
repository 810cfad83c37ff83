"""Llama 3.1 405B on 16,384 H100s (examples/clusters/dgx-h100-80gb-16k.json), sequence 8192, 2048 sequences per
iteration: the planner's time and top plans, and the predicted TFLOP/s per GPU beside the Llama 3 paper's 400 for
TP8 PP16 DP128 (Dubey et al. 2024, Table 4; a reference, not a tuning target).

TFLOP/s per GPU = model FLOPs / iteration time / GPUs, model FLOPs = 6 N T (N parameters without the embedding
table, T tokens) + attention ``12 l s^2 (a d)`` per sequence (``q k^T`` and ``att v`` forward, x3 with the backward;
unmasked, the convention of Megatron-LM's and Llama's MFU; half of it if the causal mask is credited).
Run: ``python benchmarks/llama405b_plan.py`` (prints; not a test).
"""

from __future__ import annotations

import time
from pathlib import Path

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.device import device_for_cluster
from planner.operators import OperatorOptions
from planner.request import TrainingRequest
from planner.search import plan
from profiler.hf_config import read_hf_config

ROOT = Path(__file__).resolve().parent.parent
SEQ, BATCH = 8192, 2048


def main() -> None:
    spec = read_hf_config(ROOT / "examples" / "models" / "llama-3.1-405b", seq=SEQ)
    cluster = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100-80gb-16k.json")
    n = spec.total_params() - spec.vocab * spec.hidden
    flops = 6 * n * BATCH * SEQ + 12 * spec.layers * SEQ * SEQ * spec.q_dim * BATCH
    print(f"{spec.name}: {spec.total_params() / 1e9:.1f}B parameters, {cluster.gpus} x {cluster.device}, "
          f"s={SEQ}, B={BATCH}; model FLOPs per iteration {flops:.3e}")
    for label, opts in (("unfused attention (Megatron 2021)", OperatorOptions(dropout=False)),  # Llama: no dropout
                        ("flash attention", OperatorOptions(attention="flash", dropout=False)),
                        ("flash + sequence parallel", OperatorOptions(attention="flash", dropout=False,
                                                                      sequence_parallel=True))):
        t0 = time.perf_counter()
        prof = analytic_profile(spec, device_for_cluster(cluster), options=opts)
        t1 = time.perf_counter()
        res = plan(prof, cluster, TrainingRequest(global_batch=BATCH, top=5))
        t2 = time.perf_counter()
        print(f"\n{label}: profile {t1 - t0:.2f} s, plan {t2 - t1:.2f} s ({res.evaluated} evaluated, "
              f"{res.simulated} simulated)")
        for c in res.candidates:
            gpus = c.config.tensor * c.config.pipeline * c.config.data
            print(f"  {c.config.label():55s} {c.iteration_time:7.3f} s  {flops / c.iteration_time / gpus / 1e12:5.0f} "
                  f"TFLOP/s/GPU  peak {max(c.memory) / 2**30:5.1f} GiB")
    print("\nLlama 3 paper (Table 4): TP8 CP1 PP16 DP128 on 16,384 GPUs at s=8192: 400 TFLOP/s per GPU")


if __name__ == "__main__":
    main()
