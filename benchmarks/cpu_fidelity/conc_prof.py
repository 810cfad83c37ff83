# ruff: noqa: E402, E501, E741, B007, B023
"""Alternating rounds: profile_model in one process (the other core idle) vs profile_concurrently(2) (two
processes profiling at once, as the pipeline's two stages compute at once): model F and B sums at b=2."""

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from small import SMALL

from executor.models import get_config
from profiler.concurrent import profile_concurrently
from profiler.run import profile_model

if __name__ == "__main__":
    torch.set_num_threads(1)
    cfg = get_config("gpt-tiny").with_(**SMALL)
    R = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    print("load", os.getloadavg())
    def tot(p, k):
        return sum(l.time(k, 2) for l in p.layers) * 1e3
    rat = []
    for r in range(R):
        a = profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=9)
        b = profile_concurrently(cfg, [1, 2, 4], 2, threads=1, repeats=9)
        rat.append((tot(b, "fwd") / tot(a, "fwd"), tot(b, "bwd") / tot(a, "bwd")))
        print(
            f"round {r} load {os.getloadavg()[0]:.2f}: one process F {tot(a, 'fwd'):.1f} B {tot(a, 'bwd'):.1f} | two at once F {tot(b, 'fwd'):.1f} B {tot(b, 'bwd'):.1f}"
        )
    print(
        f"median ratio two-at-once / one: F {statistics.median(x for x, _ in rat):.3f} B {statistics.median(y for _, y in rat):.3f}"
    )
