# ruff: noqa: E402, E501, E741, B007, B023
"""Spread of the one-process profile between runs (gpt-small, b=2): block.0 / head / embedding fwd and bwd,
and the min-of-two bias of `fastest`."""

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

torch.set_num_threads(1)
from small import SMALL

from executor.models import get_config
from profiler.run import profile_model

cfg = get_config("gpt-tiny").with_(**SMALL)
R = int(sys.argv[1]) if len(sys.argv) > 1 else 6
rows = []
print("load", os.getloadavg())
for r in range(R):
    p = profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=9)
    tot_f = sum(l.time("fwd", 2) for l in p.layers)
    tot_b = sum(l.time("bwd", 2) for l in p.layers)
    rows.append((tot_f, tot_b))
    L = p.layers
    print(
        f"run {r}: emb F {L[0].time('fwd', 2) * 1e3:.2f} B {L[0].time('bwd', 2) * 1e3:.2f}; block F {L[1].time('fwd', 2) * 1e3:.2f} "
        f"B {L[1].time('bwd', 2) * 1e3:.2f} (spread F {L[1].fwd_spread[2]:.2f}); head F {L[-1].time('fwd', 2) * 1e3:.2f} B {L[-1].time('bwd', 2) * 1e3:.2f}; "
        f"model F {tot_f * 1e3:.1f} B {tot_b * 1e3:.1f}"
    )
fs = [f for f, _ in rows]
bs = [b for _, b in rows]
print(
    f"model F median {statistics.median(fs) * 1e3:.1f} min {min(fs) * 1e3:.1f} max {max(fs) * 1e3:.1f}; B median {statistics.median(bs) * 1e3:.1f} min {min(bs) * 1e3:.1f} max {max(bs) * 1e3:.1f}"
)
pairs = [(min(rows[i][0], rows[i + 1][0]), min(rows[i][1], rows[i + 1][1])) for i in range(0, R - 1, 2)]
print(
    "min-of-two / median: F",
    [round(p[0] / statistics.median(fs), 3) for p in pairs],
    "B",
    [round(p[1] / statistics.median(bs), 3) for p in pairs],
)
print("load", os.getloadavg())
