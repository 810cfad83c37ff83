"""Full search for GPT-3 175B (96 layers) on 1024 A100s (DGX A100 nodes) with B^ = 1536, every schedule.

Run: ``python benchmarks/plan_bench.py [--gpus 1024] [--batch 1536] [--top 10]``. Prints the configurations
evaluated, how many were simulated, the seconds, and the best plans.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.device import device_for_cluster
from planner.model import PRESETS
from planner.request import TrainingRequest
from planner.search import plan

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1536)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--async", dest="allow_async", action="store_true", help="include PipeDream and 2BW")
    args = ap.parse_args()
    cl = load_cluster(ROOT / "examples" / "clusters" / "dgx-a100-80gb.json")
    prof = analytic_profile(PRESETS["gpt3-175b"], device_for_cluster(cl))
    req = TrainingRequest(global_batch=args.batch, gpus=args.gpus, top=args.top, allow_async=args.allow_async)
    t0 = time.perf_counter()
    res = plan(prof, cl, req)
    dt = time.perf_counter() - t0
    print(f"GPT-3 175B on {args.gpus} x {cl.device}, B^={args.batch}: evaluated {res.evaluated} configurations, "
          f"{res.considered} passed the memory pre-check, simulated {res.simulated}, in {dt:.2f} s")
    for i, c in enumerate(res.candidates):
        print(f"{i:2d} {c.config.label():60s} {c.iteration_time:8.2f} s  {c.throughput:7.1f} samples/s  "
              f"bubble {c.bubble_ratio:.3f}  peak {max(c.memory) / 2**30:5.1f} GiB")


if __name__ == "__main__":
    main()
