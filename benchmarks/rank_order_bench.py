"""The rank order in the search (:mod:`planner.placement`): for a few models and clusters, the best row planned in each
order alone (``rank_order``) and with both (the default), the search's time, and over every configuration both orders
time, how many each order makes faster and by how much at most.

Models (``examples/models``, the operator model, FlashAttention-2, no dropout, sequence parallelism, sequence 4096):
Llama 3.1 8B on 64 H100s (B = 512), Qwen2.5 7B on 32 A100s (B = 64), Mixtral 8x7B and Qwen3-30B-A3B on 64 H100s
(B = 512; grouped expert GEMMs).

Run: ``PYTHONPATH=. python benchmarks/rank_order_bench.py``.
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
CASES = [("llama-3.1-8b", "dgx-h100-80gb", 64, 512), ("qwen2.5-7b", "dgx-a100-80gb", 32, 64),
         ("mixtral-8x7b", "dgx-h100-80gb", 64, 512), ("qwen3-30b-a3b", "dgx-h100-80gb", 64, 512)]
OPTIONS = OperatorOptions(attention="flash", causal=True, dropout=False, sequence_parallel=True, expert_gemm="grouped")


def main() -> None:
    for name, cluster, gpus, batch in CASES:
        cl = load_cluster(ROOT / "examples" / "clusters" / f"{cluster}.json")
        spec = read_hf_config(ROOT / "examples" / "models" / name, seq=4096, name=name)
        prof = analytic_profile(spec, device_for_cluster(cl), options=OPTIONS)
        print(f"{name} on {gpus} GPUs of {cluster}, B = {batch}")
        for order in ("tp-pp-dp", "tp-dp-pp", None):
            start = time.perf_counter()
            res = plan(prof, cl, TrainingRequest(global_batch=batch, gpus=gpus, rank_order=order))
            took = time.perf_counter() - start
            best = res.candidates[0]
            print(f"  {order or 'both':9s} best {best.config.label():60s} {best.iteration_time:8.4f} s "
                  f"(search {took:.1f} s)")
        # every configuration both orders time: which is faster, by how much
        res = plan(prof, cl, TrainingRequest(global_batch=batch, gpus=gpus, top=100_000))
        times = {c.config: c.iteration_time for c in res.candidates if c.fits}
        ratios = []  # tp-pp-dp's time over tp-dp-pp's
        for cfg, t_inner in times.items():
            t_outer = times.get(cfg.model_copy(update={"order": "tp-dp-pp"})) if cfg.order == "tp-pp-dp" else None
            if t_outer:
                ratios.append(t_inner / t_outer)
        inner = [r for r in ratios if r < 1 - 1e-9]
        outer = [r for r in ratios if r > 1 + 1e-9]
        print(f"  {len(ratios)} configurations timed in both orders: tp-pp-dp faster in {len(inner)} (by up to "
              f"{(1 - min(inner, default=1.0)) * 100:.1f}%), tp-dp-pp in {len(outer)} (by up to "
              f"{(1 - 1 / max(outer, default=1.0)) * 100:.1f}%)")


if __name__ == "__main__":
    main()
