# ruff: noqa: E402, E501, E741, B007, B023
"""Backward of one block (b=2, thread CPU, median of 9), alternating R rounds: (fresh) the backward right after
its forward, as the profile times it; (fifo-K) K forwards kept alive and the oldest one's backward timed
(a pipeline's order: micro-batches backpropagated first in, first out)."""

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
g = torch.ones(2, cfg.seq, cfg.hidden)


def run(keep):
    alive, out = [], []
    for _i in range(11 + keep):
        alive.append(blk(x.detach().requires_grad_()))
        if len(alive) > keep:
            y = alive.pop(0)
            c0 = time.thread_time()
            y.backward(g)
            out.append(time.thread_time() - c0)
    return statistics.median(out[-9:])


R = int(sys.argv[1]) if len(sys.argv) > 1 else 8
print("load", os.getloadavg())
rs = []
for r in range(R):
    a, b, c = run(0), run(8), run(2)
    rs.append((b / a, c / a))
    print(f"round {r}: fresh {a * 1e3:.2f} fifo-8 {b * 1e3:.2f} fifo-2 {c * 1e3:.2f}")
print(
    f"median fifo-8/fresh {statistics.median(x for x, _ in rs):.3f} fifo-2/fresh {statistics.median(y for _, y in rs):.3f}; load {os.getloadavg()}"
)
