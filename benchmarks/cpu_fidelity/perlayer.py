# ruff: noqa: E402, E501, E741, B007, B023
"""Per layer, forward thread CPU inside a stage (hooks; 4 rounds of GPipe-order 8 micro-batches) vs the
profile_model figure taken just before, alternating R rounds; both stages of D=2, one process."""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import torch

torch.set_num_threads(1)
from stage_cpu import B_, SMALL, N, setup

from executor.models import get_config
from profiler.run import profile_model

cfg = get_config("gpt-tiny").with_(**SMALL)
mods = [setup(s) for s in range(2)]
acc = {}


def hooks(mod, base):
    for i, layer in enumerate(mod.layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: acc.__setitem__(("t0", base + i), time.thread_time()))
        layer.register_forward_hook(
            lambda m, a, o, i=i: acc.setdefault(base + i, []).append(time.thread_time() - acc[("t0", base + i)])
        )


for s, (mod, *_r, bounds) in enumerate(mods):
    hooks(mod, bounds[s][0])
R = int(sys.argv[1]) if len(sys.argv) > 1 else 4
print("load", os.getloadavg())
ratios = {}
for r in range(R):
    prof = profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=9)
    for k in [k for k in acc if not isinstance(k, tuple)]:
        acc[k] = []
    for s, (mod, _opt, ids, tg, hid, bounds) in enumerate(mods):
        for _it in range(3):
            keep = []
            for m in range(N):
                x = ids[m * B_ : (m + 1) * B_] if s == 0 else hid[m * B_ : (m + 1) * B_].clone().requires_grad_(True)
                t = [tg[m * B_ : (m + 1) * B_]] if mod.has_head else None
                keep.append(mod(x, t)[0])
            for o in keep:
                o.backward(torch.ones_like(o) if o.dim() else None)
            mod.zero_grad(set_to_none=True)
    line = []
    for i in sorted(k for k in acc if not isinstance(k, tuple)):
        v = statistics.median(acc[i][N:])
        p = prof.layers[i].time("fwd", 2)
        ratios.setdefault(i, []).append(v / p)
        line.append(f"{i}:{v * 1e3:.2f}/{p * 1e3:.2f}")
    print(f"round {r}: layer in-stage/profile F ms " + " ".join(line))
print("median ratio per layer:", {i: round(statistics.median(v), 3) for i, v in ratios.items()})
print("load", os.getloadavg())
