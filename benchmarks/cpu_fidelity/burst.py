# ruff: noqa: E402, E501, E741, B007, B023
"""Burst vs sustained: a gpt-small block's forward (b=2, 9 repeats, thread CPU median) right after 1 s idle vs
right after 2 s of continuous compute (the same block), alternating R rounds."""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

torch.set_num_threads(1)

from small import small_block

cfg, blk, x = small_block()


def t():
    inp = x.detach().requires_grad_()
    c0 = time.thread_time()
    blk(inp)
    return time.thread_time() - c0


def nine():
    return statistics.median(t() for _ in range(9))


for _ in range(5):
    t()
R = int(sys.argv[1]) if len(sys.argv) > 1 else 8
print("load", os.getloadavg())
rows = []
for r in range(R):
    time.sleep(1.0)
    a = nine()
    end = time.perf_counter() + 2.0
    while time.perf_counter() < end:
        t()
    b = nine()
    rows.append(b / a)
    print(f"round {r}: after idle {a * 1e3:.2f} ms, after 2 s busy {b * 1e3:.2f} ms")
print(f"median sustained/burst {statistics.median(rows):.3f}; load {os.getloadavg()}")
