# ruff: noqa: E402, E501
"""The profile's own figures for a gpt-small block at b=2, alternating R rounds: alone (the layer timed alone,
as before) vs in flight (profiler.layers: 8 earlier forwards alive); forward and backward medians, ms."""

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

torch.set_num_threads(1)
from small import SMALL

from executor.models import build_layers, get_config
from profiler.layers import IN_FLIGHT, LayerMeasurement, _measure_size, make_inputs

cfg = get_config("gpt-tiny").with_(**SMALL)
blk = build_layers(cfg, 0, 1, 2)[0].float().train()
new = make_inputs(cfg, 1, blk, 2, torch.device("cpu"), torch.float32)
R = int(sys.argv[1]) if len(sys.argv) > 1 else 6
print("load", os.getloadavg())
rf, rb = [], []
for r in range(R):
    a, b = LayerMeasurement(), LayerMeasurement()
    _measure_size(blk, new, 2, torch.device("cpu"), 2, 9, False, a, alive=0)
    _measure_size(blk, new, 2, torch.device("cpu"), 2, 9, False, b, alive=IN_FLIGHT)
    rf.append(b.fwd[2].median / a.fwd[2].median)
    rb.append(b.bwd[2].median / a.bwd[2].median)
    print(f"round {r}: alone F {a.fwd[2].median * 1e3:.2f} B {a.bwd[2].median * 1e3:.2f} | in flight F {b.fwd[2].median * 1e3:.2f} B {b.bwd[2].median * 1e3:.2f}")
print(f"median in flight / alone: F {statistics.median(rf):.3f} B {statistics.median(rb):.3f}; load {os.getloadavg()}")
