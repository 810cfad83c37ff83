# ruff: noqa: E402, E501, E741, B007, B023
"""One block's forward (b=2, thread CPU, median of 9 after 2), alternating R rounds: (free) each repeat's output
and graph freed before the next, as the profile does; (alive) the outputs and graphs of the last 8 repeats kept
alive, as GPipe keeps a stage's 8 micro-batches (the allocator cannot hand the same warm buffers back)."""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

torch.set_num_threads(1)
from executor.models import build_layers, get_config

SMALL = {"hidden": 256, "heads": 4, "seq": 64, "layers": 8, "vocab": 512}
cfg = get_config("gpt-tiny").with_(**SMALL)
blk = build_layers(cfg, 0, 1, 2)[0].float().train()
x = torch.randn(2, cfg.seq, cfg.hidden)


def run(keep):
    alive, out = [], []
    for _i in range(11 + keep):
        inp = x.detach().requires_grad_()
        c0 = time.thread_time()
        y = blk(inp)
        d = time.thread_time() - c0
        alive.append(y)
        alive = alive[-keep:] if keep else []
        del y
        out.append(d)
    return statistics.median(out[-9:])


R = int(sys.argv[1]) if len(sys.argv) > 1 else 8
print("load", os.getloadavg())
rs = []
for r in range(R):
    a, b, c = run(0), run(8), run(2)
    rs.append((b / a, c / a))
    print(f"round {r}: free {a * 1e3:.2f} alive-8 {b * 1e3:.2f} alive-2 {c * 1e3:.2f}")
print(
    f"median alive-8/free {statistics.median(x for x, _ in rs):.3f} alive-2/free {statistics.median(y for _, y in rs):.3f}; load {os.getloadavg()}"
)
