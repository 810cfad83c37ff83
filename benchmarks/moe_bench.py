"""Mixtures of experts in the planner: the operator model's layer times and a search, printed.

For Mixtral 8x7B, Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B (a gated shared expert beside 60 routed ones), DeepSeek-V2-Lite
(latent attention, 2 shared experts, its first layer dense) and gpt-oss-20b (attention sinks, biased experts, the
clamped gate; ``examples/models``) on an H100 (FlashAttention-2, no
dropout, fused kernels, sequence 4096, micro-batch 1): one transformer layer's forward and backward at t = 1, 2, 4, 8
with the experts as one grouped GEMM and one expert at a time (:mod:`planner.moe`), the achieved TFLOP/s of the
forward, and the dense twin (one MLP as wide as a token's ``k`` experts and the shared expert) beside them; then
``plan`` on 64 H100s (DGX nodes, global batch 512) with each, timed, its best rows (with the time their experts' all-
to-alls take on the last device) and the best row at each expert-parallel size ``e``
(:mod:`planner.expert_parallel`), with the experts split over ``t`` and whole on each rank (expert tensor parallelism
1). Then Qwen3-30B-A3B on 8 H100s (B = 64): the slime project's recipe is t = 4, e = 8, etp = 1.

Run: ``python benchmarks/moe_bench.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.device import device_for_cluster
from planner.model import ModelSpec
from planner.operators import OperatorOptions, layer_flops, layer_operators, time_operators
from planner.request import TrainingRequest
from planner.search import plan
from profiler.hf_config import read_hf_config

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "dgx-h100-80gb.json"


def options(gemm: str) -> OperatorOptions:
    return OperatorOptions(attention="flash", causal=True, dropout=False, sequence_parallel=True, expert_gemm=gemm)


def layer_table(spec: ModelSpec, device) -> None:  # noqa: ANN001
    # the dense twin: one MLP as wide as a token's k experts and the shared expert
    twin = spec.with_(experts=None, experts_per_token=None, expert_ffn_hidden=None, shared_expert_ffn_hidden=None,
                      shared_expert_gate=False, dense_layers=(), router_score="softmax", router_groups=None,
                      router_group_topk=None, router_bias=False, routed_scaling=1.0,
                      ffn_hidden=spec.f_e * int(spec.experts_per_token or 1) + (spec.shared_expert_ffn_hidden or 0))
    print(f"{spec.name}: one layer, b = 1, s = {spec.seq} (ms: forward / backward, TFLOP/s of the forward)")
    for t in (1, 2, 4, 8):
        cells = []
        for label, s, gemm in (("grouped", spec, "grouped"), ("sequential", spec, "sequential"),
                               ("dense twin", twin, "grouped")):
            ops = layer_operators(s, 1, t, options(gemm))
            p = time_operators(ops, device, "bf16")
            cells.append(f"{label} {p.fwd * 1e3:6.2f} / {p.bwd * 1e3:6.2f} ({layer_flops(ops)[0] / p.fwd / 1e12:4.0f})")
        print(f"  t={t}: " + "   ".join(cells))


def main() -> None:
    cl = load_cluster(CLUSTER)
    device = device_for_cluster(cl)
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "gpt-oss-20b"):
        spec = read_hf_config(ROOT / "examples" / "models" / name, seq=4096, name=name)
        print(f"{name}: {spec.total_params():,} parameters, {spec.experts} experts, {spec.experts_per_token} per token")
        layer_table(spec, device)
        for gemm in ("grouped", "sequential"):
            prof = analytic_profile(spec, device, options=options(gemm))
            start = time.perf_counter()
            res = plan(prof, cl, TrainingRequest(global_batch=512, gpus=64, top=3))
            took = time.perf_counter() - start
            print(f"  plan, {gemm} experts, 64 H100s, B = 512: {took:.2f} s, {res.evaluated} configurations, "
                  f"{res.simulated} simulated")
            for c in res.candidates:
                a2a = c.breakdown.get("alltoall_in_compute")
                print(f"    {c.config.label():40s} {c.iteration_time:7.3f} s  peak {max(c.memory) / 2**30:5.1f} GiB"
                      + (f"  all-to-alls {a2a:.3f} s" if a2a else ""))
            best = {}  # the best row at each expert-parallel size e, with the experts split over t and whole
            for c in plan(prof, cl, TrainingRequest(global_batch=512, gpus=64, top=400)).candidates:
                best.setdefault((c.config.expert, c.config.expert_tensor or 0), c)
            for whole in (0, 1):
                rows = sorted((e, c) for (e, w), c in best.items() if w == whole)
                print(f"    best per e, experts {'whole (etp = 1)' if whole else 'split over t'}: " + ", ".join(
                    f"e={e} {c.iteration_time:.3f} s ({c.config.label()})" for e, c in rows))
        print()
    spec = read_hf_config(ROOT / "examples" / "models" / "qwen3-30b-a3b", seq=4096, name="qwen3-30b-a3b")
    prof = analytic_profile(spec, device, options=options("grouped"))
    res = plan(prof, cl, TrainingRequest(global_batch=64, gpus=8, top=5))
    print("qwen3-30b-a3b on 8 H100s, B = 64 (grouped experts):")
    for c in res.candidates:
        print(f"    {c.config.label():50s} {c.iteration_time:7.3f} s  peak {max(c.memory) / 2**30:5.1f} GiB")


if __name__ == "__main__":
    main()
